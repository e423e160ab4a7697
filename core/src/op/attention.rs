//! Attributes of `relax.nn.attention` / `relax.nn.attention_bias` (TVM's `AttentionAttrs`),
//! read from and written back to keyword literals.
//!
//! Contract: TVM 0.27's op pair — `R.nn.attention(q, k, v, bias=None, scale=None,
//! causal_mask=None, window_size=None)` builds `relax.nn.attention(q, k, v)` without a bias and
//! `relax.nn.attention_bias(q, k, v, bias)` with one; both carry the same three attributes,
//! printed in this order: `scale` (an optional `float32` immediate, printed
//! `T.float32(0.125)`), `causal_mask` (`None`, `"TopLeft"` or `"BottomRight"`, checked when
//! read) and `window_size` (an optional integer, ≥ 1 when given).
//!
//! Semantics (TVM's legalization, `_te_attention`): per batch `b` and query head `h`,
//! `S = (Q_bh · K_bgᵀ) · scale` (`scale` defaults to `1 / sqrt(head_dim)`), `+ bias`
//! (broadcast to `(batch, heads, seq_q, seq_kv)`), causal masking keeps key `j` for query `i`
//! when `j <= i + offset` (`offset` 0 for `TopLeft`, `|seq_q - seq_kv|` for `BottomRight`),
//! softmax over the keys, `· V_bg`. Query head `h` reads key/value head
//! `h / (heads_q / heads_kv)` (grouped-query attention; TVM's type inference allows it, its
//! legalization assumes equal heads).
//!
//! ```text
//! lv: R.Tensor((2, 5, 4, 32), dtype="float16") = R.nn.attention(q, k, v, scale=None, causal_mask=None, window_size=None)
//! lv1: R.Tensor((2, 5, 4, 32), dtype="float16") = R.nn.attention_bias(q, k, v, b, scale=T.float32(0.125), causal_mask="BottomRight", window_size=None)
//! ```

use super::attrs::Kwargs;
use super::{AttrLit, F64};

/// TVM's `causal_mask` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CausalMask {
    /// Key `j` is visible to query `i` when `j <= i` (`np.tril(*, k=0)`).
    TopLeft,
    /// Key `j` is visible to query `i` when `j <= i + |seq_q - seq_kv|` (TVM's
    /// `np.tril(*, k=abs(seq_len - seq_len_kv))`).
    BottomRight,
}

impl CausalMask {
    /// The attribute text.
    pub fn as_str(self) -> &'static str {
        match self {
            CausalMask::TopLeft => "TopLeft",
            CausalMask::BottomRight => "BottomRight",
        }
    }

    /// The mask's diagonal offset for these sequence lengths.
    pub fn offset(self, seq_q: usize, seq_kv: usize) -> usize {
        match self {
            CausalMask::TopLeft => 0,
            CausalMask::BottomRight => seq_q.abs_diff(seq_kv),
        }
    }
}

/// Attributes of `relax.nn.attention` and `relax.nn.attention_bias`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttentionAttrs {
    /// The softmax scale (`None`: `1 / sqrt(head_dim)`).
    pub scale: Option<F64>,
    /// The causal mask, if any.
    pub causal_mask: Option<CausalMask>,
    /// The sliding window, if any (keys per query, ≥ 1).
    pub window_size: Option<i64>,
}

/// Attribute names in Python-API order.
pub(super) const ATTENTION_ATTRS: &[&str] = &["scale", "causal_mask", "window_size"];

/// The attributes that print as a `T.float32(...)` immediate.
pub(super) const FLOAT32_IMM_ATTRS: &[&str] = &["scale"];

/// Reads the attributes of either op.
pub(super) fn attention_attrs(kw: &Kwargs<'_>) -> Result<Box<AttentionAttrs>, String> {
    let scale = match kw.raw("scale") {
        None | Some(AttrLit::None) => None,
        Some(AttrLit::Float(f)) => Some(F64(*f)),
        Some(AttrLit::Int(i)) => Some(F64(*i as f64)),
        Some(v) => return Err(kw.error("scale", "a float or None", v)),
    };
    if let Some(F64(s)) = scale
        && !s.is_finite()
    {
        return Err(kw.invalid("scale", &format!("expected a finite scale, found {s}")));
    }
    let causal_mask = match kw.raw("causal_mask") {
        None | Some(AttrLit::None) => None,
        Some(AttrLit::Str(s)) if s == "TopLeft" => Some(CausalMask::TopLeft),
        Some(AttrLit::Str(s)) if s == "BottomRight" => Some(CausalMask::BottomRight),
        Some(v) => {
            return Err(kw.error("causal_mask", "\"TopLeft\", \"BottomRight\" or None", v));
        }
    };
    let window_size = kw.opt_int("window_size", None)?;
    if let Some(w) = window_size
        && w < 1
    {
        return Err(kw.invalid(
            "window_size",
            &format!("expected a window of at least 1 key, found {w}"),
        ));
    }
    Ok(Box::new(AttentionAttrs {
        scale,
        causal_mask,
        window_size,
    }))
}

/// The attributes in TVM's printing order.
pub(super) fn attention_kwargs(a: &AttentionAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        (
            "scale",
            a.scale.map_or(AttrLit::None, |F64(s)| AttrLit::Float(s)),
        ),
        (
            "causal_mask",
            a.causal_mask
                .map_or(AttrLit::None, |c| AttrLit::Str(c.as_str().to_string())),
        ),
        (
            "window_size",
            a.window_size.map_or(AttrLit::None, AttrLit::Int),
        ),
    ]
}
