//! Property tests of `relax.layout_transform` between split layouts (`NCHW16c` and kin): for
//! any two layouts of `NCHW` (any axis order, any axis split by a factor) and a tensor whose
//! extents divide, the map between them ([`IndexMap::between`]) puts every element where the
//! layouts' definitions say (logical index `x` of an axis split by `k` at `x / k` and `x % k`),
//! and the map back gives the tensor again.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::op::{IndexMap, Layout, Op};
use fusebox_cpu::{Tensor, Value, eval_op};
use proptest::prelude::*;

/// A layout of `NCHW`: the four letters in `order`, and each letter `i` with `splits[i] > 1`
/// split by that factor, its sub-axis placed after the axis at `at[i]` of the primal ones.
fn layout(order: &[usize], splits: &[usize; 4], at: &[usize; 4]) -> String {
    let letters = ["N", "C", "H", "W"];
    let mut axes: Vec<String> = order.iter().map(|&i| letters[i].to_string()).collect();
    // Sub-axes appended after the primal axis at position `at[i] % (len + 1)` of the list so far.
    for i in 0..4 {
        if splits[i] > 1 {
            let pos = at[i] % (axes.len() + 1);
            axes.insert(pos, format!("{}{}", splits[i], letters[i].to_lowercase()));
        }
    }
    axes.concat()
}

/// Where logical element `idx` (`NCHW` order) sits in a tensor held in `l`, and that tensor's
/// shape, from the definition of a split layout.
fn place(l: &Layout, logical: &[usize; 4], idx: &[usize; 4]) -> (Vec<usize>, usize) {
    let letter = |c: u8| b"NCHW".iter().position(|&x| x == c).unwrap();
    let mut shape = Vec::new();
    let mut coord = Vec::new();
    for a in l.axes() {
        let i = letter(a.letter);
        let k = l.sub(a.letter).map_or(1, |(_, k)| k as usize);
        match a.factor {
            Some(f) => {
                shape.push(f as usize);
                coord.push(idx[i] % f as usize);
            }
            None => {
                shape.push(logical[i] / k);
                coord.push(idx[i] / k);
            }
        }
    }
    let flat = coord
        .iter()
        .zip(&shape)
        .fold(0usize, |acc, (&c, &d)| acc * d + c);
    (shape, flat)
}

fn transform(x: &Tensor, m: IndexMap) -> Tensor {
    match eval_op(
        &Op::LayoutTransform(Box::new(m)),
        &[Value::Tensor(x.clone())],
    ) {
        Ok(Value::Tensor(t)) => t,
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn elements_land_where_the_layouts_say_and_come_back(
        order_a in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
        order_b in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
        split in (0usize..4, prop::sample::select(vec![2usize, 4, 8, 16])),
        in_both in any::<bool>(),
        at_a in prop::array::uniform4(0usize..8),
        at_b in prop::array::uniform4(0usize..8),
        outer in prop::array::uniform4(1usize..4),
    ) {
        // One axis split by `k`, in `b` always and in `a` when `in_both`.
        let (axis, k) = split;
        let mut sb = [1usize; 4];
        sb[axis] = k;
        let sa = if in_both { sb } else { [1; 4] };
        let (la, lb) = (layout(&order_a, &sa, &at_a), layout(&order_b, &sb, &at_b));
        let a = Layout::parse(&la, "NCHW").unwrap();
        let b = Layout::parse(&lb, "NCHW").unwrap();
        let mut logical = outer;
        logical[axis] *= k;
        let n: usize = logical.iter().product();
        // The tensor held in `a`: element with logical index `idx` holds its `NCHW` rank.
        let mut data = vec![0.0f32; n];
        let mut each = Vec::with_capacity(n);
        for i0 in 0..logical[0] {
            for i1 in 0..logical[1] {
                for i2 in 0..logical[2] {
                    for i3 in 0..logical[3] {
                        let idx = [i0, i1, i2, i3];
                        let rank = ((i0 * logical[1] + i1) * logical[2] + i2) * logical[3] + i3;
                        let (_, at) = place(&a, &logical, &idx);
                        data[at] = rank as f32;
                        each.push((idx, rank));
                    }
                }
            }
        }
        let (shape_a, _) = place(&a, &logical, &[0; 4]);
        let x = Tensor::from_f32(shape_a, data.clone()).unwrap();
        let m = IndexMap::between(&a, &b).unwrap();
        let y = transform(&x, m);
        let (shape_b, _) = place(&b, &logical, &[0; 4]);
        prop_assert_eq!(y.shape(), shape_b.as_slice(), "{} -> {}", la, lb);
        let yv = y.to_f32_vec();
        for (idx, rank) in &each {
            let (_, at) = place(&b, &logical, idx);
            prop_assert_eq!(yv[at], *rank as f32, "{} -> {} at {:?}", la, lb, idx);
        }
        let back = transform(&y, IndexMap::between(&b, &a).unwrap());
        prop_assert_eq!(back.to_f32_vec(), data);
    }
}
