//! ONNX's `TfIdfVectorizer` (opset 9) over integer tokens, lowered to ops fusebox has: every
//! n-gram of the pool is matched against every window of the input at once.
//!
//! Contract (ONNX's reference and onnxruntime):
//!
//! - The pool (`pool_int64s`, split by `ngram_counts` into the 1-grams, 2-grams, ...) gives
//!   each n-gram an id in pool order; `ngram_indexes[id]` is its output column. Only n-grams of
//!   `min_gram_length..=max_gram_length` items count. An n-gram repeated in the pool is an
//!   error, as in onnxruntime (the reference would count it at its last id).
//! - In a row of `C` tokens, an n-gram of `n ≥ 2` items is counted once per skip distance
//!   `d = 1..=max_skip_count + 1` at every start `i` with `i + (n - 1)·d < C` whose tokens
//!   `x[i], x[i + d], …` are the n-gram; a 1-gram once per position (skips do not repeat it).
//! - Per gram size `n` and distance `d`: the `(W, n)` windows are a constant index table
//!   (`relax.take`), compared with the `(P, n)` n-grams (`relax.equal`), all-equal per window
//!   (`relax.min` over the items of `float32` flags) and summed over the windows: `(…, P)`
//!   counts. The counts of every size are concatenated, weighted, padded with one zero and
//!   gathered into the `O` output columns (`relax.take` of a constant index per column, the
//!   zero where no n-gram goes; one gather per n-gram a column shares, added).
//!   `weights` belong to the n-grams (`weights[i]` to the pool's i-th, as the spec and
//!   onnxruntime read them; ONNX's reference indexes them by output column instead, the same
//!   when `ngram_indexes` is `0, 1, 2, …`): `mode="TF"` sends the counts, `"TFIDF"` the counts
//!   times the weights (1 without), `"IDF"` the weight (or 1) of each n-gram whose count is
//!   positive.
//! - `X` is `(C)` or `(N, C)` of `int32` or `int64` with a static `C`; the output is `(O)` or
//!   `(N, O)` `float32`, `O = max(ngram_indexes) + 1`. `pool_strings` (string tokens) is not
//!   supported: fusebox has no string tensors.
//!
//! ```text
//! Y = TfIdfVectorizer(X: i32[2, 6]; min_gram_length=2, max_gram_length=2, max_skip_count=0,
//!     ngram_counts=[0, 4], ngram_indexes=[0, 1, 2], pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
//!     mode="TF")
//!   → lv = R.take(R.astype(X, "int64"), W, axis=1)            # W: (5, 2) windows [[0, 1], ...]
//!     lv1 = R.equal(R.expand_dims(lv, axis=[2]), G)           # G: (3, 2) bigrams → (2, 5, 3, 2)
//!     lv2 = R.sum(R.min(R.astype(lv1, "float32"), axis=[3]), axis=[1])   # (2, 3)
//!     Y = R.take(R.nn.pad(lv2, [0, 0, 0, 1]), R.const([0, 1, 2]), axis=1)
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, dims_str, invalid, req};
use super::call;
use crate::error::Result;
use crate::ir::DType;
use crate::op::{ElemOp, F64, Op, PadAttrs, PadMode, ReduceAttrs};

/// The most elements of one size's comparison (`rows · windows · n-grams · n`) the lowering
/// builds; a larger pool or input is refused at import rather than left to the memory limit.
const MAX_COMPARE: i64 = 1 << 28;

/// The most output columns (`max(ngram_indexes) + 1`): the gathers' index tables are built at
/// import.
const MAX_COLUMNS: i64 = 1 << 24;

/// `TfIdfVectorizer(X)` (see the module doc).
pub(super) fn tfidf_vectorizer(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (xd, dt) = im.dims(x)?;
    if a.strings("pool_strings").is_some_and(|s| !s.is_empty()) {
        return Err(invalid(
            "TfIdfVectorizer with pool_strings: string tokens are not supported (only \
             pool_int64s)",
        ));
    }
    if !matches!(dt, DType::I32 | DType::I64) || !(1..=2).contains(&xd.len()) {
        return Err(invalid(format!(
            "TfIdfVectorizer needs int32 or int64 tokens of shape (C) or (N, C), found \
             {dt}{}",
            dims_str(&xd)
        )));
    }
    let c = xd[xd.len() - 1].as_static().ok_or_else(|| {
        invalid(format!(
            "TfIdfVectorizer needs a static row length, found {}",
            dims_str(&xd)
        ))
    })?;
    let pool = a.ints("pool_int64s").unwrap_or_default();
    let counts = a.ints("ngram_counts").unwrap_or_default();
    let indexes = a.ints("ngram_indexes").unwrap_or_default();
    let min_n = a.int("min_gram_length", 1);
    let max_n = a.int("max_gram_length", 1);
    let max_skip = a.int("max_skip_count", 0);
    if min_n < 1 || max_n < min_n || max_skip < 0 {
        return Err(invalid(format!(
            "TfIdfVectorizer needs 1 ≤ min_gram_length ≤ max_gram_length and max_skip_count ≥ \
             0, found {min_n}, {max_n} and {max_skip}"
        )));
    }
    // The n-grams of each size: (size, first id, items).
    let mut sizes: Vec<(i64, usize, &[i64])> = Vec::new();
    let mut id = 0usize;
    for (k, &start) in counts.iter().enumerate() {
        let end = counts.get(k + 1).copied().unwrap_or(pool.len() as i64);
        let n = k as i64 + 1;
        let ok = 0 <= start && start <= end && end <= pool.len() as i64;
        if !ok {
            return Err(invalid(format!(
                "TfIdfVectorizer's ngram_counts {counts:?} must rise within the pool of {} items",
                pool.len()
            )));
        }
        let items = &pool[start as usize..end as usize];
        if items.len() as i64 % n != 0 {
            return Err(invalid(format!(
                "TfIdfVectorizer: the {} pool items of {n}-grams are not a whole number of \
                 {n}-grams",
                items.len()
            )));
        }
        sizes.push((n, id, items));
        id += items.len() / n as usize;
    }
    if indexes.len() != id {
        return Err(invalid(format!(
            "TfIdfVectorizer has {id} n-grams in its pool but {} ngram_indexes",
            indexes.len()
        )));
    }
    let out = indexes.iter().copied().max().map_or(0, |m| m + 1);
    if let Some(i) = indexes.iter().find(|&&i| !(0..MAX_COLUMNS).contains(&i)) {
        return Err(invalid(format!(
            "TfIdfVectorizer's ngram_indexes must lie in 0..{MAX_COLUMNS}, found {i}"
        )));
    }
    let weights = a.floats("weights").unwrap_or_default();
    if !weights.is_empty() && weights.len() != id {
        return Err(invalid(format!(
            "TfIdfVectorizer has {} weights for {id} n-grams (one per n-gram)",
            weights.len()
        )));
    }
    let mode = a.string("mode", "TF");
    if !["TF", "IDF", "TFIDF"].contains(&mode.as_str()) {
        return Err(invalid(format!(
            "TfIdfVectorizer's mode `{mode}` is not one of TF, IDF, TFIDF"
        )));
    }
    let rows = if xd.len() == 2 {
        xd[0].as_static().unwrap_or(1)
    } else {
        1
    };
    let axis = xd.len() as i64 - 1;
    let tokens = im.emit(Op::Astype { dtype: DType::I64 }, vec![x])?;
    let mode = match mode.as_str() {
        "TF" => Weighting::Tf,
        "IDF" => Weighting::Idf,
        _ => Weighting::TfIdf,
    };
    // Per size in range: counts (…, P) and, per n-gram, its output column and weight.
    let mut parts = Vec::new();
    let mut columns: Vec<(i64, f64)> = Vec::new();
    for &(n, first, items) in &sizes {
        if n < min_n || n > max_n || items.is_empty() {
            continue;
        }
        let grams: Vec<&[i64]> = items.chunks(n as usize).collect();
        let p = grams.len() as i64;
        let mut seen = std::collections::BTreeSet::new();
        for (g, gram) in grams.iter().enumerate() {
            if !seen.insert(*gram) {
                return Err(invalid(format!(
                    "TfIdfVectorizer's pool holds the {n}-gram {gram:?} twice"
                )));
            }
            let w = match (mode, weights.get(first + g)) {
                (Weighting::Tf, _) | (_, None) => 1.0,
                (_, Some(&w)) => f64::from(w),
            };
            columns.push((indexes[first + g], w));
        }
        let table = im.i64_const(vec![p, n], items)?;
        let mut total = None;
        let skips = if n == 1 { 0 } else { max_skip };
        // The loop stops at the first distance whose n-gram spans the whole row (d < C).
        for d in 1..=skips.saturating_add(1) {
            let w = (n - 1).checked_mul(d).map_or(0, |span| c - span);
            if w <= 0 {
                break;
            }
            let size = rows
                .checked_mul(w)
                .and_then(|v| v.checked_mul(p))
                .and_then(|v| v.checked_mul(n));
            if size.is_none_or(|s| s > MAX_COMPARE) {
                return Err(invalid(format!(
                    "TfIdfVectorizer: matching {p} {n}-grams against {w} windows of {rows} \
                     row(s) exceeds {MAX_COMPARE} comparisons"
                )));
            }
            let idx: Vec<i64> = (0..w)
                .flat_map(|i| (0..n).map(move |k| i + k * d))
                .collect();
            let idx = im.i64_const(vec![w, n], &idx)?;
            let win = im.take(tokens, axis, idx)?;
            let win = im.emit(
                Op::ExpandDims {
                    axis: vec![axis + 1],
                },
                vec![win],
            )?;
            let eq = im.emit(Op::Elem(ElemOp::Equal), vec![win, table])?;
            let eq = im.emit(Op::Astype { dtype: DType::F32 }, vec![eq])?;
            let all = im.emit(
                Op::Min(Box::new(ReduceAttrs {
                    axis: Some(vec![-1]),
                    keepdims: false,
                })),
                vec![eq],
            )?;
            let sum = im.emit(
                Op::Sum(Box::new(ReduceAttrs {
                    axis: Some(vec![-2]),
                    keepdims: false,
                })),
                vec![all],
            )?;
            total = Some(match total {
                None => sum,
                Some(t) => im.emit(Op::Add, vec![t, sum])?,
            });
        }
        if let Some(t) = total {
            parts.push(t);
        } else {
            // No window fits: these n-grams count zero.
            columns.truncate(columns.len() - grams.len());
        }
    }
    let mut shape = xd[..xd.len() - 1].to_vec();
    shape.push(crate::ir::Dim::Static(out));
    if parts.is_empty() || out == 0 {
        let zero = im.scalar(0.0, DType::F32);
        let s = im.b.shape(shape);
        return Ok(call(Op::BroadcastTo, vec![zero, s]));
    }
    let mut all = if parts.len() == 1 {
        parts[0]
    } else {
        let t = im.b.tuple(parts)?;
        im.emit(Op::Concat { axis: Some(-1) }, vec![t])?
    };
    if mode == Weighting::Idf {
        let zero = im.scalar(0.0, DType::F32);
        let seen = im.emit(Op::Elem(ElemOp::Greater), vec![all, zero])?;
        all = im.emit(Op::Astype { dtype: DType::F32 }, vec![seen])?;
    }
    if columns.iter().any(|&(_, w)| w != 1.0) {
        let w: Vec<f64> = columns.iter().map(|&(_, w)| w).collect();
        let w = im.f64_const(vec![w.len() as i64], &w)?;
        let w = im.emit(Op::Astype { dtype: DType::F32 }, vec![w])?;
        all = im.emit(Op::Multiply, vec![all, w])?;
    }
    // One zero after the n-grams, for the columns no (further) n-gram reaches.
    let mut pad_width = vec![0; 2 * xd.len()];
    pad_width[2 * xd.len() - 1] = 1;
    let padded = im.emit(
        Op::Pad(Box::new(PadAttrs {
            pad_width,
            pad_value: F64(0.0),
            pad_mode: PadMode::Constant,
        })),
        vec![all],
    )?;
    // The n-grams of each column, in pool order; gather k reads each column's k-th.
    let zero_slot = columns.len() as i64;
    let mut per_column: Vec<Vec<i64>> = vec![Vec::new(); out as usize];
    for (g, &(j, _)) in columns.iter().enumerate() {
        per_column[j as usize].push(g as i64);
    }
    let layers = per_column.iter().map(Vec::len).max().unwrap_or(0);
    let mut y = None;
    for k in 0..layers {
        let idx: Vec<i64> = per_column
            .iter()
            .map(|gs| gs.get(k).copied().unwrap_or(zero_slot))
            .collect();
        let idx = im.i64_const(vec![out], &idx)?;
        let part = im.take(padded, axis, idx)?;
        y = Some(match y {
            None => part,
            Some(t) => im.emit(Op::Add, vec![t, part])?,
        });
    }
    // `layers ≥ 1`: `parts` is not empty, so some n-gram has a column.
    let y = y.ok_or_else(|| invalid("TfIdfVectorizer: no output column"))?;
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// How counts become outputs.
#[derive(Clone, Copy, PartialEq)]
enum Weighting {
    Tf,
    Idf,
    TfIdf,
}
