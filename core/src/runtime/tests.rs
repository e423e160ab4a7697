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
        StorageRef::Bool(&[true, true, false])
    );
    assert_eq!(
        t.cast(DType::F16).to_f32_vec(),
        vec![1.5, -2.699_218_8, 0.0]
    );
    let big = Tensor::from_i64(vec![1], vec![(1 << 60) + 1]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(big.cast(DType::I64).to_i64_vec(), vec![(1 << 60) + 1]);
}

#[test]
fn an_owned_buffer_of_the_same_dtype_is_moved_not_copied() {
    let v = vec![1.5f32, -2.0, 0.25];
    let at = v.as_ptr();
    match Storage::F32(v).into_cast(DType::F32) {
        Storage::F32(w) => {
            assert_eq!(w.as_ptr(), at);
            assert_eq!(w, vec![1.5, -2.0, 0.25]);
        }
        other => panic!("expected float32, found {other:?}"),
    }
    // Another dtype converts as `cast` does.
    assert_eq!(
        Storage::F32(vec![1.5, -2.7]).into_cast(DType::I32),
        Storage::F32(vec![1.5, -2.7]).cast(DType::I32)
    );
    assert_eq!(
        Storage::I64(vec![3, -4]).into_cast(DType::F32),
        Storage::F32(vec![3.0, -4.0])
    );
}

#[test]
fn sizes_parse_with_units_and_reject_nonsense() {
    use memory::parse_size;
    assert_eq!(parse_size("8GiB"), Ok(8 << 30));
    assert_eq!(parse_size("8 G"), Ok(8 << 30));
    assert_eq!(parse_size("1.5KiB"), Ok(1536));
    assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("32B"), Ok(32));
    for bad in [
        "",
        "0",
        "GiB",
        "8XB",
        "-1",
        "1.",
        "99999999999999999999",
        "16777216TiB",
    ] {
        assert!(parse_size(bad).is_err(), "`{bad}` parsed");
    }
}

#[test]
fn an_allocation_beyond_the_limit_is_a_typed_error_naming_what_and_shape() {
    let e = memory::check_within("relax.nn.conv2d", DType::F32, &[1 << 20, 1 << 20], 1 << 30)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.starts_with(
            "memory limit exceeded: relax.nn.conv2d needs 4 TiB (4398046511104 bytes) for \
             float32 [1048576, 1048576], limit 1 GiB (1073741824 bytes"
        ),
        "{e}"
    );
    // A byte count beyond u64 is reported as such, not wrapped.
    let e = memory::check_within("x", DType::I64, &[1 << 40, 1 << 40], 1 << 30)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("needs more than 2^64 bytes"), "{e}");
    assert!(memory::check_within("x", DType::F32, &[256], 1024).is_ok());
    assert!(memory::check_within("x", DType::F32, &[257], 1024).is_err());
}

#[test]
fn tensors_of_the_process_limit_allocate_through_the_checked_path() {
    // The default limit (no test in this process sets one) is far below 2^62 bytes.
    assert!(memory::default_memory_limit() > 0);
    let e = Tensor::zeros(vec![1 << 31, 1 << 31], DType::F32)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("memory limit exceeded: a tensor needs"), "{e}");
    let e = Tensor::full(vec![usize::MAX, 2], DType::F32, 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("more than 2^64 bytes"), "{e}");
    let t = Tensor::full(vec![2, 3], DType::I32, 7.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.to_i64_vec(), vec![7; 6]);
}

#[test]
fn the_type_of_an_op_result_is_checked_before_its_kernel() {
    use crate::op::Op;
    let big = Value::Shape(vec![1_000_000, 1_000_000]);
    let x =
        Value::Tensor(Tensor::full(vec![1, 1], DType::F32, 0.0).unwrap_or_else(|e| panic!("{e}")));
    let e = memory::check_op_result(&Op::BroadcastTo, &[x.clone(), big])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains(
            "relax.broadcast_to needs 3.6 TiB (4000000000000 bytes) for float32 [1000000, 1000000]"
        ),
        "{e}"
    );
    assert!(memory::check_op_result(&Op::BroadcastTo, &[x, Value::Shape(vec![4, 4])]).is_ok());
}

#[test]
fn a_weak_storage_handle_names_only_that_live_unchanged_storage() {
    let a =
        Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap_or_else(|e| panic!("{e}"));
    let w = a.storage_weak();
    // Clones and reshapes share the storage; an equal tensor made anew does not.
    let b = a.clone();
    assert!(a.shares_storage(&w) && b.shares_storage(&w));
    let r = a.reshaped(vec![4]).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.shares_storage(&w));
    let same_values =
        Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap_or_else(|e| panic!("{e}"));
    assert!(!same_values.shares_storage(&w));
    // A write through a shared handle copies first: the writer leaves the storage.
    let mut c = a.clone();
    c.storage_mut();
    assert!(!c.shares_storage(&w) && a.shares_storage(&w));
    drop((b, r, c));
    // A write through the last strong handle moves the data out while a weak handle exists,
    // so the handle no longer names the tensor (its old contents are gone).
    let mut last = a;
    if let Storage::F32(v) = last.storage_mut() {
        v[0] = 9.0;
    }
    assert!(!last.shares_storage(&w));
    assert_eq!(w.strong_count(), 0);
}

#[test]
fn a_tensor_over_a_longer_buffer_shows_only_its_own_elements() {
    let ok = |r: Result<Tensor>| r.unwrap_or_else(|e| panic!("{e}"));
    let buf = Storage::F32(vec![1.0, 2.0, 3.0, 4.0, 9.0, 9.0]);
    let t = ok(Tensor::from_prefix(vec![2, 2], buf));
    let exact = ok(Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]));
    assert_eq!(t.numel(), 4);
    assert_eq!((t.buffer_len(), exact.buffer_len()), (6, 4));
    assert_eq!(t.storage(), StorageRef::F32(&[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(t.as_f32(), Some(&[1.0f32, 2.0, 3.0, 4.0][..]));
    assert_eq!(t.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(t, exact);
    assert_eq!(format!("{t:?}"), format!("{exact:?}"));
    let constant = |t: &Tensor| t.to_constant().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(constant(&t), constant(&exact));
    assert_eq!(t.cast(DType::I64).as_i64(), Some(&[1i64, 2, 3, 4][..]));
    // A reshape keeps the view (and shares the buffer).
    let r = ok(t.reshaped(vec![4]));
    assert_eq!(r.storage().len(), 4);
    assert_eq!(r.storage_ptr(), t.storage_ptr());
    assert!(t.reshaped(vec![6]).is_err());
    // Taken out or written, the storage is exactly the tensor's elements ...
    assert_eq!(
        r.clone().into_storage(),
        Storage::F32(vec![1.0, 2.0, 3.0, 4.0])
    );
    let mut w = r.clone();
    if let Storage::F32(v) = w.storage_mut() {
        assert_eq!(v.len(), 4);
        v[0] = 5.0;
    }
    assert_eq!(w.to_f32_vec(), vec![5.0, 2.0, 3.0, 4.0]);
    assert_eq!(t.to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    drop((r, w));
    // ... while the whole buffer comes back to the one owner that asks for it.
    let t = match t.try_into_buffer() {
        Ok(b) => b,
        Err(_) => panic!("the tensor was the buffer's only owner"),
    };
    assert_eq!(t, Storage::F32(vec![1.0, 2.0, 3.0, 4.0, 9.0, 9.0]));
    let u = ok(Tensor::from_prefix(vec![2], t));
    assert_eq!(
        u.try_into_storage().ok(),
        Some(Storage::F32(vec![1.0, 2.0]))
    );
    // A buffer shorter than the shape is an error.
    assert!(Tensor::from_prefix(vec![3], Storage::I64(vec![1, 2])).is_err());
}

proptest::proptest! {
    /// A tensor over the first elements of a longer buffer reads, compares, converts,
    /// reshapes and gives up its storage exactly as one over those elements alone.
    #[test]
    fn a_prefix_view_is_indistinguishable_from_its_elements(
        data in proptest::collection::vec(-1.0e6f32..1.0e6, 0..64),
        extra in proptest::collection::vec(-1.0f32..1.0, 0..16),
    ) {
        let n = data.len();
        let mut buf = data.clone();
        buf.extend_from_slice(&extra);
        let exact = Tensor::from_f32(vec![n], data.clone()).unwrap_or_else(|e| panic!("{e}"));
        let view = Tensor::from_prefix(vec![n], Storage::F32(buf.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        proptest::prop_assert_eq!(&view, &exact);
        proptest::prop_assert_eq!(view.numel(), n);
        proptest::prop_assert_eq!(view.buffer_len(), n + extra.len());
        proptest::prop_assert_eq!(view.storage(), exact.storage());
        proptest::prop_assert_eq!(view.to_f64_vec(), exact.to_f64_vec());
        proptest::prop_assert_eq!(view.cast(DType::F16), exact.cast(DType::F16));
        let flat = view.reshaped(vec![1, n]).unwrap_or_else(|e| panic!("{e}"));
        proptest::prop_assert_eq!(flat.as_f32(), Some(&data[..]));
        drop(flat);
        let mut written = view.clone();
        if let Storage::F32(v) = written.storage_mut() {
            proptest::prop_assert_eq!(v.len(), n);
        }
        proptest::prop_assert_eq!(view.clone().into_storage(), Storage::F32(data.clone()));
        drop(written);
        match view.try_into_buffer() {
            Ok(b) => proptest::prop_assert_eq!(b, Storage::F32(buf)),
            Err(_) => proptest::prop_assert!(false, "the view was the buffer's only owner"),
        }
    }
}
