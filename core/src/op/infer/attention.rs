//! Type inference of `relax.nn.attention(q, k, v)` and `relax.nn.attention_bias(q, k, v,
//! bias)`, TVM 0.27's `InferTypeAttention`.
//!
//! Contract: query `(B, Sq, N, H)`, key `(B, Skv, Nkv, H)`, value `(B, Skv, Nkv', Hv)`, output
//! `(B, Sq, N, Hv)` in the query's dtype. Every operand has rank 4. Dims are compared only
//! when both are static (TVM's `CanProve(a != b)`): batches equal, `N` a multiple of the key's
//! and of the value's heads, the key and value sequence lengths equal, the query and key head
//! dims equal. The bias has rank 4 and broadcasts to `(B, N, Sq, Skv)`: each of its first
//! three dims equals the target's or is 1, the last equals `Skv`. Unknown shapes give a
//! rank-4 result with what is known.
//!
//! Where this departs from TVM (which checks no dtype and fails later, at build): the operands
//! must share one float dtype when known.
//!
//! ```text
//! q: (2, 5, 8, 64) f16, k: (2, 7, 2, 64) f16, v: (2, 7, 2, 32) f16, bias: (1, 8, 1, 7) f16
//! R.nn.attention_bias(q, k, v, bias)  -> (2, 5, 8, 32) f16
//! ```

use super::super::AttentionAttrs;
use super::{Cx, common_dtype, differ, known, unknown};
use crate::ir::{Dim, Type};

pub(super) fn attention(cx: &Cx<'_>, _a: &AttentionAttrs) -> Result<Type, String> {
    let names = ["query", "key", "value", "bias"];
    // Three operands, or four with a bias (a missing one is `cx.tensor`'s error).
    let n_args = cx.args.len().clamp(3, 4);
    let mut ts = Vec::with_capacity(n_args);
    for (i, what) in names.iter().enumerate().take(n_args) {
        ts.push(cx.tensor(i, what)?);
    }
    let mut dtype = None;
    for (t, what) in ts.iter().zip(names) {
        cx.float(t, what)?;
        dtype = common_dtype(cx, dtype, t.dtype)?;
        if let Some(r) = t.rank()
            && r != 4
        {
            let expected = if what == "bias" {
                "4 dimensions broadcasting to (batch, heads, seq_len, seq_len_kv)".to_string()
            } else {
                format!("4 dimensions (batch, seq_len, num_heads, head_dim) for the {what}")
            };
            return Err(cx.err(format!(
                "expected {expected}, found the {what} with {r} dimensions"
            )));
        }
    }
    let dims = |i: usize| ts.get(i).and_then(|t| t.dims.as_deref());
    let (q, k, v) = (dims(0), dims(1), dims(2));
    let eq = |a: Option<&[Dim]>, ai: usize, b: Option<&[Dim]>, bi: usize, what: &str| {
        if let (Some(x), Some(y)) = (a.and_then(|a| a.get(ai)), b.and_then(|b| b.get(bi)))
            && differ(x, y)
        {
            return Err(cx.err(format!("expected {what} to be the same, found {x} and {y}")));
        }
        Ok(())
    };
    eq(q, 0, k, 0, "the query and key batch sizes")?;
    eq(q, 0, v, 0, "the query and value batch sizes")?;
    eq(k, 1, v, 1, "the key and value sequence lengths")?;
    eq(q, 3, k, 3, "the query and key head dims")?;
    for (other, what) in [(k, "key"), (v, "value")] {
        if let (Some(n), Some(m)) = (
            q.and_then(|q| q[2].as_static()),
            other.and_then(|o| o[2].as_static()),
        ) && (m == 0 || n % m != 0)
        {
            return Err(cx.err(format!(
                "expected the query's number of heads ({n}) to be a multiple of the {what}'s ({m})"
            )));
        }
    }
    if let Some(b) = dims(3) {
        let target = [
            (q.map(|q| &q[0]), "batch size"),
            (q.map(|q| &q[2]), "number of heads"),
            (q.map(|q| &q[1]), "query sequence length"),
        ];
        for (i, (t, what)) in target.iter().enumerate() {
            if let Some(t) = t
                && differ(t, &b[i])
                && b[i] != Dim::Static(1)
            {
                return Err(cx.err(format!(
                    "expected the bias's dim {i} to be the {what} ({t}) or 1, found {}",
                    b[i]
                )));
            }
        }
        if let Some(kd) = k
            && differ(&kd[1], &b[3])
        {
            return Err(cx.err(format!(
                "expected the bias's last dim to be the key sequence length ({}), found {}",
                kd[1], b[3]
            )));
        }
    }
    match (q, v) {
        (Some(q), Some(v)) => Ok(known(
            vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()],
            dtype,
        )),
        _ => Ok(unknown(Some(4), dtype)),
    }
}
