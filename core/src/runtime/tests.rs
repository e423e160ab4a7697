use super::*;

#[test]
fn constant_round_trip_is_bit_exact() {
    for dtype in DType::ALL {
        let c = Constant::scalar(2.5, dtype);
        let t = Tensor::from_constant(&c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.dtype(), dtype);
        assert_eq!(t.to_constant().ok(), Some(c));
    }
    let bytes: Vec<u8> = [1.0f32, -2.0, 3.5, f32::NAN]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let c = Constant::from_bytes(DType::F32, vec![2, 2], bytes).unwrap_or_else(|e| panic!("{e}"));
    let t = Tensor::from_constant(&c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(t.to_constant().ok(), Some(c));
}

#[test]
fn shape_mismatch_is_an_error() {
    assert!(Tensor::from_f32(vec![2, 2], vec![1.0; 3]).is_err());
    assert!(Tensor::zeros(vec![usize::MAX, 2], DType::F32).is_err());
    let t = Tensor::from_f32(vec![2, 3], vec![0.0; 6]).unwrap_or_else(|e| panic!("{e}"));
    assert!(t.reshaped(vec![5]).is_err());
    assert_eq!(
        t.reshaped(vec![3, 2]).map(|t| t.shape().to_vec()).ok(),
        Some(vec![3, 2])
    );
}

#[test]
fn casts() {
    let t = Tensor::from_f32(vec![3], vec![1.5, -2.7, 0.0]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.cast(DType::I32).to_i64_vec(), vec![1, -2, 0]);
    assert_eq!(
        t.cast(DType::Bool).storage(),
        &Storage::Bool(vec![true, true, false])
    );
    assert_eq!(
        t.cast(DType::F16).to_f32_vec(),
        vec![1.5, -2.699_218_8, 0.0]
    );
    let big = Tensor::from_i64(vec![1], vec![(1 << 60) + 1]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(big.cast(DType::I64).to_i64_vec(), vec![(1 << 60) + 1]);
}
