//! The elementwise comparison, logic, bitwise, selection and math family (issue 17): one
//! [`ElemOp`] per TVM Relax op, carried by [`super::Op::Elem`].
//!
//! Contract:
//!
//! - Every [`ElemOp`] has TVM Relax's exact name (`relax.equal`, `relax.where`,
//!   `relax.floor_mod`, …) and no attributes: TVM defines none for these ops, so they print as
//!   `R.less(a, b)` and parse back from the same spelling.
//! - [`ElemOp::arity`] is the number of tensor arguments (1, 2, or 3 for `where`).
//! - [`ElemOp::fusion_kind`] is TVM's `OpPatternKind`: binary ops and `where` broadcast, unary
//!   ops are elementwise.
//! - Comparisons, the logical ops and `isnan`/`isinf`/`isfinite` produce `bool` tensors;
//!   bitwise ops and shifts take integer (or bool) tensors; the float math ops (`sin`, …) take
//!   float tensors; `floor`/`ceil`/`round`/`sign`/`floor_mod`/`mod` take floats and integers.
//!
//! ```text
//! m: R.Tensor((4, 4), dtype="bool") = R.less(i, j)
//! n: R.Tensor((4, 4), dtype="bool") = R.isnan(x)
//! y: R.Tensor((4, 4), dtype="float32") = R.where(m, x, R.const(-1e9, "float32"))
//! ```

use super::FusionKind;

/// One op of the elementwise comparison / logic / math family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemOp {
    /// `relax.equal`
    Equal,
    /// `relax.not_equal`
    NotEqual,
    /// `relax.less`
    Less,
    /// `relax.less_equal`
    LessEqual,
    /// `relax.greater`
    Greater,
    /// `relax.greater_equal`
    GreaterEqual,
    /// `relax.logical_and`
    LogicalAnd,
    /// `relax.logical_or`
    LogicalOr,
    /// `relax.logical_xor`
    LogicalXor,
    /// `relax.logical_not`
    LogicalNot,
    /// `relax.bitwise_and`
    BitwiseAnd,
    /// `relax.bitwise_or`
    BitwiseOr,
    /// `relax.bitwise_xor`
    BitwiseXor,
    /// `relax.bitwise_not`
    BitwiseNot,
    /// `relax.left_shift`
    LeftShift,
    /// `relax.right_shift` (arithmetic on signed integers)
    RightShift,
    /// `relax.where(cond, x, y)`
    Where,
    /// `relax.isnan`
    IsNan,
    /// `relax.isinf`
    IsInf,
    /// `relax.isfinite`
    IsFinite,
    /// `relax.floor_mod`: the remainder takes the divisor's sign.
    FloorMod,
    /// `relax.mod`: the remainder takes the dividend's sign (C's `%`, `fmod`).
    Mod,
    /// `relax.floor`
    Floor,
    /// `relax.ceil`
    Ceil,
    /// `relax.round` (half to even)
    Round,
    /// `relax.sign`
    Sign,
    /// `relax.sin`
    Sin,
    /// `relax.cos`
    Cos,
    /// `relax.tan`
    Tan,
    /// `relax.asin`
    Asin,
    /// `relax.acos`
    Acos,
    /// `relax.atan`
    Atan,
    /// `relax.sinh`
    Sinh,
    /// `relax.cosh`
    Cosh,
    /// `relax.asinh`
    Asinh,
    /// `relax.acosh`
    Acosh,
    /// `relax.atanh`
    Atanh,
}

/// What an op's operands and result are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemClass {
    /// A comparison: two operands of one dtype, a `bool` result.
    Compare,
    /// `logical_and`/`or`/`xor`/`not`: `bool` operands and result.
    Logical,
    /// Bitwise ops and shifts: integer (or `bool`, except shifts) operands, same dtype out.
    Bitwise,
    /// `where`: a `bool` condition and two values of one dtype.
    Select,
    /// `isnan`/`isinf`/`isfinite`: any numeric operand, a `bool` result.
    Classify,
    /// `floor_mod`/`mod`: float or integer operands, same dtype out.
    Modulo,
    /// `floor`/`ceil`/`round`/`sign`: float or integer operand, same dtype out.
    Rounding,
    /// Trigonometric and hyperbolic functions: a float operand, same dtype out.
    FloatMath,
}

impl ElemOp {
    /// Every op of the family, in a fixed order.
    pub const ALL: [ElemOp; 37] = [
        ElemOp::Equal,
        ElemOp::NotEqual,
        ElemOp::Less,
        ElemOp::LessEqual,
        ElemOp::Greater,
        ElemOp::GreaterEqual,
        ElemOp::LogicalAnd,
        ElemOp::LogicalOr,
        ElemOp::LogicalXor,
        ElemOp::LogicalNot,
        ElemOp::BitwiseAnd,
        ElemOp::BitwiseOr,
        ElemOp::BitwiseXor,
        ElemOp::BitwiseNot,
        ElemOp::LeftShift,
        ElemOp::RightShift,
        ElemOp::Where,
        ElemOp::IsNan,
        ElemOp::IsInf,
        ElemOp::IsFinite,
        ElemOp::FloorMod,
        ElemOp::Mod,
        ElemOp::Floor,
        ElemOp::Ceil,
        ElemOp::Round,
        ElemOp::Sign,
        ElemOp::Sin,
        ElemOp::Cos,
        ElemOp::Tan,
        ElemOp::Asin,
        ElemOp::Acos,
        ElemOp::Atan,
        ElemOp::Sinh,
        ElemOp::Cosh,
        ElemOp::Asinh,
        ElemOp::Acosh,
        ElemOp::Atanh,
    ];

    /// Every name of the family, in the order of [`ElemOp::ALL`].
    pub const NAMES: [&'static str; 37] = [
        "relax.equal",
        "relax.not_equal",
        "relax.less",
        "relax.less_equal",
        "relax.greater",
        "relax.greater_equal",
        "relax.logical_and",
        "relax.logical_or",
        "relax.logical_xor",
        "relax.logical_not",
        "relax.bitwise_and",
        "relax.bitwise_or",
        "relax.bitwise_xor",
        "relax.bitwise_not",
        "relax.left_shift",
        "relax.right_shift",
        "relax.where",
        "relax.isnan",
        "relax.isinf",
        "relax.isfinite",
        "relax.floor_mod",
        "relax.mod",
        "relax.floor",
        "relax.ceil",
        "relax.round",
        "relax.sign",
        "relax.sin",
        "relax.cos",
        "relax.tan",
        "relax.asin",
        "relax.acos",
        "relax.atan",
        "relax.sinh",
        "relax.cosh",
        "relax.asinh",
        "relax.acosh",
        "relax.atanh",
    ];

    /// TVM's name (`"relax.less_equal"`).
    pub fn name(self) -> &'static str {
        let i = ElemOp::ALL.iter().position(|o| *o == self).unwrap_or(0);
        ElemOp::NAMES.get(i).copied().unwrap_or("relax.equal")
    }

    /// The op named `name`, if it belongs to the family.
    pub fn from_name(name: &str) -> Option<ElemOp> {
        let i = ElemOp::NAMES.iter().position(|n| *n == name)?;
        ElemOp::ALL.get(i).copied()
    }

    /// The operand and result class.
    pub fn class(self) -> ElemClass {
        use ElemOp::*;
        match self {
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual => ElemClass::Compare,
            LogicalAnd | LogicalOr | LogicalXor | LogicalNot => ElemClass::Logical,
            BitwiseAnd | BitwiseOr | BitwiseXor | BitwiseNot | LeftShift | RightShift => {
                ElemClass::Bitwise
            }
            Where => ElemClass::Select,
            IsNan | IsInf | IsFinite => ElemClass::Classify,
            FloorMod | Mod => ElemClass::Modulo,
            Floor | Ceil | Round | Sign => ElemClass::Rounding,
            Sin | Cos | Tan | Asin | Acos | Atan | Sinh | Cosh | Asinh | Acosh | Atanh => {
                ElemClass::FloatMath
            }
        }
    }

    /// The number of tensor arguments.
    pub fn arity(self) -> usize {
        use ElemOp::*;
        match self {
            Where => 3,
            LogicalNot | BitwiseNot | IsNan | IsInf | IsFinite => 1,
            _ => match self.class() {
                ElemClass::Rounding | ElemClass::FloatMath => 1,
                _ => 2,
            },
        }
    }

    /// TVM's `OpPatternKind`: `Broadcast` for binary ops and `where`, `ElemWise` for unary
    /// ones.
    pub fn fusion_kind(self) -> FusionKind {
        if self.arity() == 1 {
            FusionKind::ElemWise
        } else {
            FusionKind::Broadcast
        }
    }
}
