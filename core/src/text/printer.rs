//! The printer of the text format: writes a [`Module`] the way TVM 0.27's `script()` prints a
//! Relax module.
//!
//! ```text
//! # from tvm.script import ir as I
//! # from tvm.script import relax as R
//!
//! @I.ir_module
//! class Module:
//!     @R.function
//!     def main(x: R.Tensor((2, 3), dtype="float32")) -> R.Tensor((2, 3), dtype="float32"):
//!         with R.dataflow():
//!             gv: R.Tensor((2, 3), dtype="float32") = R.nn.relu(x)
//!             R.output(gv)
//!         return gv
//! ```
//!
//! Contract: printing is deterministic; functions are printed sorted by name, every binding is
//! annotated with its var's type, symbolic dims are strings in signatures and plain in bodies
//! (with `n = T.int64()` lines first), rank-0 constants print inline as `R.const(v, "dtype")` and
//! the others as `metadata["relax.expr.Constant"][i]` (numbered in print order, identical
//! constants sharing an index). Var names are made unique within each top-level function
//! (nested functions included) by appending `_1`, `_2`, ... as TVM does. The output parses back
//! to an equal module and printing that again gives the same text.

use super::constants::NS_CONSTANT;
use super::lexer::quote;
use super::parser::is_reserved;
use crate::ir::{
    AttrValue, Callee, Constant, DType, Dim, ExprId, ExprKind, Function, Module, PrimValue, Sym,
    Type,
};
use crate::op::AttrLit;
use rustc_hash::{FxHashMap as FxMap, FxHashSet as FxSet};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

/// The printed text of a module and its non-scalar constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Printed {
    /// The TVMScript text.
    pub text: String,
    /// `constants[i]` is `metadata["relax.expr.Constant"][first_index + i]` in the text.
    pub constants: Vec<Constant>,
    /// The index of the first constant: past every constant without a value the module keeps
    /// in that namespace (they print with their own indices), 0 when there is none.
    pub first_index: usize,
}

/// C's `%.17g` of `v`, with `.0` appended when the result looks like an integer
/// (`0.0`, `1.0000000000000001e-05`, `0.10000000000000001`, `0.5`, `inf`).
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "inf".to_string()
        } else {
            "-inf".to_string()
        };
    }
    const P: i32 = 17;
    let e_repr = format!("{:.*e}", (P - 1) as usize, v);
    let (mant, exp) = e_repr.split_once('e').unwrap_or((e_repr.as_str(), "0"));
    let x: i32 = exp.parse().unwrap_or(0);
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    let mut out = if !(-4..P).contains(&x) {
        let m = strip(mant);
        let sign = if x < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", x.unsigned_abs())
    } else {
        let prec = usize::try_from(P - 1 - x).unwrap_or(0);
        strip(&format!("{v:.prec$}"))
    };
    if !out.contains(['.', 'e']) && !out.contains("inf") && !out.contains("nan") {
        out.push_str(".0");
    }
    out
}

fn sanitize(name: &str) -> Cow<'_, str> {
    let valid = name.starts_with(|c: char| c == '_' || c.is_alphabetic())
        && name.chars().all(|c| c == '_' || c.is_alphanumeric());
    if valid {
        return Cow::Borrowed(name);
    }
    let mut s: String = name
        .chars()
        .map(|c| {
            if c == '_' || c.is_alphanumeric() {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| !(c == '_' || c.is_alphabetic())) {
        s.insert(0, 'v');
    }
    Cow::Owned(s)
}

/// Variable names in use within one top-level function (nested functions share it).
#[derive(Clone, Default)]
struct Names {
    used: FxSet<String>,
    next: FxMap<String, u32>,
}

impl Names {
    fn fresh(&mut self, want: &str) -> String {
        let base = sanitize(want);
        if !is_reserved(&base) && !self.used.contains(base.as_ref()) {
            let s = base.into_owned();
            self.used.insert(s.clone());
            return s;
        }
        let n = self.next.entry(base.to_string()).or_insert(0);
        loop {
            *n += 1;
            let cand = format!("{base}_{n}");
            if self.used.insert(cand.clone()) {
                return cand;
            }
        }
    }
}

struct Printer {
    consts: Vec<Constant>,
    const_idx: HashMap<Constant, usize>,
    first_index: usize,
    uses_tir: bool,
    class_name: &'static str,
    /// The symbolic dims defined so far in the function being printed: by its parameters'
    /// types, then by each binding whose annotation first mentions one (printed as
    /// `R.match_cast`, which TVM requires to define a symbol inside a function).
    defined: BTreeSet<Sym>,
}

fn dtype_str(d: DType) -> &'static str {
    match d {
        DType::F16 => "\"float16\"",
        DType::BF16 => "\"bfloat16\"",
        DType::F32 => "\"float32\"",
        DType::F64 => "\"float64\"",
        DType::I8 => "\"int8\"",
        DType::U8 => "\"uint8\"",
        DType::I32 => "\"int32\"",
        DType::I64 => "\"int64\"",
        DType::Bool => "\"bool\"",
    }
}

/// Appends the decimal digits of `v` (faster than `write!` in the printer's hot loop).
fn push_int(out: &mut String, v: i64) {
    let mut buf = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(b) = buf.get_mut(i) {
            *b = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    if v < 0 {
        out.push('-');
    }
    for &b in buf.get(i..).unwrap_or(&[]) {
        out.push(char::from(b));
    }
}

fn write_dim(out: &mut String, d: &Dim, sig: bool) {
    match d {
        Dim::Static(v) => push_int(out, *v),
        _ if sig => {
            let _ = write!(out, "\"{d}\"");
        }
        _ => {
            let _ = write!(out, "{d}");
        }
    }
}

fn write_dims(out: &mut String, dims: &[Dim], sig: bool, open: char, close: char) {
    out.push(open);
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_dim(out, d, sig);
    }
    if dims.len() == 1 && open == '(' {
        out.push(',');
    }
    out.push(close);
}

/// Whether a type mentions a prim type (printed with `T.`).
fn has_prim(t: &Type) -> bool {
    match t {
        Type::Prim(_) => true,
        Type::Tuple(ts) => ts.iter().any(has_prim),
        Type::Func(ft) => ft.params.iter().any(has_prim) || has_prim(&ft.ret),
        _ => false,
    }
}

/// A type as the printer writes it in a binding's annotation (`R.Tensor((1, 3), dtype="float32")`).
pub(crate) fn type_text(t: &Type) -> String {
    let mut out = String::new();
    write_type(&mut out, t, false);
    out
}

/// Writes a type; `sig` quotes symbolic dims (function signatures).
fn write_type(out: &mut String, t: &Type, sig: bool) {
    match t {
        Type::Tensor(tt) => match &tt.dims {
            Some(dims) => {
                out.push_str("R.Tensor(");
                write_dims(out, dims, sig, '(', ')');
                if let Some(d) = tt.dtype {
                    out.push_str(", dtype=");
                    out.push_str(dtype_str(d));
                }
                out.push(')');
            }
            None => {
                let mut parts = Vec::new();
                if let Some(d) = tt.dtype {
                    parts.push(format!("dtype={}", dtype_str(d)));
                }
                if let Some(n) = tt.ndim {
                    parts.push(format!("ndim={n}"));
                }
                if parts.is_empty() {
                    out.push_str("R.Tensor");
                } else {
                    let _ = write!(out, "R.Tensor({})", parts.join(", "));
                }
            }
        },
        Type::Tuple(fields) => {
            if fields.is_empty() {
                out.push_str("R.Tuple");
                return;
            }
            out.push_str("R.Tuple(");
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_type(out, f, sig);
            }
            out.push(')');
        }
        Type::Shape {
            dims: Some(dims), ..
        } => {
            out.push_str("R.Shape(");
            write_dims(out, dims, sig, '[', ']');
            out.push(')');
        }
        Type::Shape {
            dims: None,
            ndim: Some(n),
        } => {
            let _ = write!(out, "R.Shape(ndim={n})");
        }
        Type::Shape {
            dims: None,
            ndim: None,
        } => out.push_str("R.Shape"),
        // As TVM 0.27 prints a prim value's type (`T.int64`, `T.bool`).
        Type::Prim(d) => {
            let _ = write!(out, "T.{}", d.name());
        }
        Type::Func(ft) => {
            out.push_str("R.Callable((");
            for (i, p) in ft.params.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_type(out, p, sig);
            }
            if ft.params.len() == 1 {
                out.push(',');
            }
            out.push_str("), ");
            write_type(out, &ft.ret, sig);
            out.push(')');
        }
        Type::Object => out.push_str("R.Object"),
    }
}

fn write_attr_lit(out: &mut String, l: &AttrLit) {
    match l {
        AttrLit::None => out.push_str("None"),
        AttrLit::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        AttrLit::Int(i) => {
            let _ = write!(out, "{i}");
        }
        AttrLit::Float(f) => out.push_str(&format_float(*f)),
        AttrLit::Str(s) => out.push_str(&quote(s)),
        AttrLit::List(items) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_attr_lit(out, it);
            }
            out.push(']');
        }
        AttrLit::IndexMap(m) => {
            let _ = write!(out, "T.index_map({m})");
        }
    }
}

fn attr_value(v: &AttrValue) -> String {
    match v {
        AttrValue::Str(s) => quote(s),
        AttrValue::Int(i) => i.to_string(),
        AttrValue::Float(f) => format_float(*f),
        AttrValue::Bool(b) => (if *b { "True" } else { "False" }).to_string(),
    }
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("    ");
    }
}

/// The symbols to declare at the top of `f`'s body: `sym_vars`, then any other symbol its
/// types use, in first-use order.
fn function_syms(f: &Function) -> Vec<Sym> {
    let mut out = f.sym_vars.clone();
    let mut seen: HashSet<Sym> = out.iter().cloned().collect();
    let mut add = |t: &Type| {
        let mut s = BTreeSet::new();
        t.collect_syms(&mut s);
        for sym in s {
            if seen.insert(sym.clone()) {
                out.push(sym);
            }
        }
    };
    for &p in &f.params {
        add(&f.var(p).ty);
    }
    add(&f.ret_ty);
    for b in f.bindings() {
        add(&f.var(b.var).ty);
    }
    out
}

fn uses_global(f: &Function) -> bool {
    f.exprs.iter().any(|(_, e)| {
        matches!(
            e.kind,
            ExprKind::Call {
                callee: Callee::Global(_),
                ..
            }
        )
    })
}

impl Printer {
    fn constant(&mut self, out: &mut String, c: &Constant) {
        if c.shape.is_empty() {
            let v = match c.dtype {
                DType::Bool => (if c.get_f64(0).unwrap_or(0.0) != 0.0 {
                    "True"
                } else {
                    "False"
                })
                .to_string(),
                d if d.is_float() => format_float(c.get_f64(0).unwrap_or(0.0)),
                _ => c.get_i64(0).unwrap_or(0).to_string(),
            };
            let _ = write!(out, "R.const({v}, {})", dtype_str(c.dtype));
            return;
        }
        let idx = match self.const_idx.get(c) {
            Some(&i) => i,
            None => {
                let i = self.first_index + self.consts.len();
                self.consts.push(c.clone());
                self.const_idx.insert(c.clone(), i);
                i
            }
        };
        let _ = write!(out, "metadata[\"{NS_CONSTANT}\"][{idx}]");
    }

    fn expr(&mut self, out: &mut String, f: &Function, names: &[String], e: ExprId) {
        let Some(data) = f.exprs.get(e) else {
            out.push_str("None");
            return;
        };
        let name_of = |v: crate::ir::VarId| -> &str {
            names
                .get(crate::ir::EntityId::index(v))
                .map_or("_", |s| if s.is_empty() { "_" } else { s.as_str() })
        };
        match &data.kind {
            ExprKind::Var(v) => out.push_str(name_of(*v)),
            ExprKind::Const(c) => self.constant(out, c),
            ExprKind::ConstRef(c) => {
                let _ = write!(out, "{c}");
            }
            ExprKind::Call { callee, args } => {
                let mut f32_imm: &[&str] = &[];
                let kwargs = match callee {
                    Callee::Op(op) => {
                        let n = op.name();
                        let _ = write!(out, "R.{}(", n.strip_prefix("relax.").unwrap_or(n));
                        f32_imm = op.float32_imm_attrs();
                        op.kwargs()
                    }
                    Callee::Global(g) => {
                        let _ = write!(out, "{}.{g}(", self.class_name_for_calls());
                        Vec::new()
                    }
                    Callee::Local(v) => {
                        let _ = write!(out, "{}(", name_of(*v));
                        Vec::new()
                    }
                };
                let mut first = true;
                for &a in args {
                    if !first {
                        out.push_str(", ");
                    }
                    first = false;
                    self.expr(out, f, names, a);
                }
                for (k, v) in &kwargs {
                    if !first {
                        out.push_str(", ");
                    }
                    first = false;
                    let _ = write!(out, "{k}=");
                    match v {
                        // As TVM prints a `FloatImm` attribute (`scale=T.float32(0.125)`).
                        AttrLit::Float(x) if f32_imm.contains(k) => {
                            let _ = write!(out, "T.float32({})", format_float(*x));
                        }
                        AttrLit::IndexMap(_) => {
                            self.uses_tir = true;
                            write_attr_lit(out, v);
                        }
                        _ => write_attr_lit(out, v),
                    }
                }
                out.push(')');
            }
            ExprKind::Tuple(fields) => {
                out.push('(');
                for (i, &x) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.expr(out, f, names, x);
                }
                if fields.len() == 1 {
                    out.push(',');
                }
                out.push(')');
            }
            ExprKind::TupleGetItem(t, i) => {
                self.expr(out, f, names, *t);
                let _ = write!(out, "[{i}]");
            }
            ExprKind::ShapeLit(dims) => {
                out.push_str("R.shape(");
                write_dims(out, dims, false, '[', ']');
                out.push(')');
            }
            ExprKind::Prim(p) => match p {
                PrimValue::Int(i) => {
                    let _ = write!(out, "R.prim_value({i})");
                }
                PrimValue::Float(v, d) => {
                    self.uses_tir = true;
                    let _ = write!(out, "R.prim_value(T.{}({}))", d.name(), format_float(*v));
                }
                PrimValue::Str(s) => {
                    let _ = write!(out, "R.str({})", quote(s));
                }
                PrimValue::Bool(b) => {
                    self.uses_tir = true;
                    let _ = write!(
                        out,
                        "R.prim_value(T.bool({}))",
                        if *b { "True" } else { "False" }
                    );
                }
            },
            // Printed as a statement by `blocks`; never an operand in normal form.
            ExprKind::Function(_) | ExprKind::If(_) => out.push_str("None"),
        }
    }

    /// Prints `blocks` at `level` (an `if`'s branches recursively one level deeper).
    #[allow(clippy::too_many_arguments, reason = "internal recursion helper")]
    fn blocks(
        &mut self,
        out: &mut String,
        f: &Function,
        blocks: &[crate::ir::Block],
        level: usize,
        names: &mut Names,
        var_names: &mut Vec<String>,
        cls_here: bool,
    ) {
        for block in blocks {
            let lvl = if block.dataflow {
                indent(out, level);
                out.push_str("with R.dataflow():\n");
                level + 1
            } else {
                level
            };
            for b in &block.bindings {
                let vi = crate::ir::EntityId::index(b.var);
                let vname = names.fresh(&f.var(b.var).name);
                match f.exprs.get(b.value).map(|d| &d.kind) {
                    Some(ExprKind::If(i)) => {
                        indent(out, lvl);
                        out.push_str("if ");
                        self.expr(out, f, var_names, i.cond);
                        out.push_str(":\n");
                        // Each branch is its own scope: both may reuse a name, and what they
                        // bind is not visible after the `if`.
                        let saved = names.clone();
                        for (k, s) in i.branches().into_iter().enumerate() {
                            if k == 1 {
                                indent(out, lvl);
                                out.push_str("else:\n");
                                *names = saved.clone();
                            }
                            self.blocks(out, f, &s.blocks, lvl + 1, names, var_names, cls_here);
                            indent(out, lvl + 1);
                            out.push_str(&vname);
                            out.push_str(": ");
                            write_type(out, &f.var(b.var).ty, false);
                            out.push_str(" = ");
                            self.expr(out, f, var_names, s.body);
                            out.push('\n');
                        }
                        *names = saved;
                    }
                    Some(ExprKind::Function(g)) => {
                        indent(out, lvl);
                        out.push_str("# from tvm.script import relax as R\n\n");
                        self.function(out, &vname, g, lvl, true, names, cls_here);
                        out.push('\n');
                    }
                    _ => {
                        let vt = &f.var(b.var).ty;
                        let mut new_syms = BTreeSet::new();
                        vt.collect_syms(&mut new_syms);
                        new_syms.retain(|s| !self.defined.contains(s));
                        let value_ty = f.exprs.get(b.value).map(|d| &d.ty);
                        let mut value_syms = BTreeSet::new();
                        if let Some(t) = value_ty {
                            t.collect_syms(&mut value_syms);
                        }
                        let defines = new_syms.iter().any(|s| !value_syms.contains(s));
                        self.defined.extend(new_syms);
                        indent(out, lvl);
                        if !defines {
                            out.push_str(&vname);
                            out.push_str(": ");
                            write_type(out, vt, false);
                            out.push_str(" = ");
                            self.expr(out, f, var_names, b.value);
                            out.push('\n');
                        } else {
                            // The annotation names an extent the value's type leaves out: TVM
                            // defines its symbol with `R.match_cast` of the value (bound first
                            // under a name of its own unless it is a var already).
                            let is_var = matches!(
                                f.exprs.get(b.value).map(|d| &d.kind),
                                Some(ExprKind::Var(_))
                            );
                            let mut cast = String::new();
                            if is_var {
                                self.expr(&mut cast, f, var_names, b.value);
                            } else {
                                cast = names.fresh(&format!("{vname}_value"));
                                out.push_str(&cast);
                                out.push_str(": ");
                                if let Some(t) = value_ty {
                                    write_type(out, t, false);
                                }
                                out.push_str(" = ");
                                self.expr(out, f, var_names, b.value);
                                out.push('\n');
                                indent(out, lvl);
                            }
                            out.push_str(&vname);
                            out.push_str(": ");
                            write_type(out, vt, false);
                            let _ = write!(out, " = R.match_cast({cast}, ");
                            write_type(out, vt, false);
                            out.push_str(")\n");
                        }
                    }
                }
                if let Some(slot) = var_names.get_mut(vi) {
                    *slot = vname;
                }
            }
            if block.dataflow {
                indent(out, lvl);
                out.push_str("R.output(");
                let mut first = true;
                for b in &block.bindings {
                    if !f.var(b.var).dataflow {
                        if !first {
                            out.push_str(", ");
                        }
                        first = false;
                        out.push_str(
                            var_names
                                .get(crate::ir::EntityId::index(b.var))
                                .map_or("_", String::as_str),
                        );
                    }
                }
                out.push_str(")\n");
            }
        }
    }

    fn class_name_for_calls(&self) -> &'static str {
        "cls"
    }

    #[allow(clippy::too_many_arguments, reason = "internal recursion helper")]
    fn function(
        &mut self,
        out: &mut String,
        name: &str,
        f: &Function,
        level: usize,
        nested: bool,
        names: &mut Names,
        cls_defined: bool,
    ) {
        let syms = function_syms(f);
        for s in &syms {
            names.used.insert(s.name().to_string());
        }
        let outer_defined = std::mem::take(&mut self.defined);
        for &p in &f.params {
            f.var(p).ty.collect_syms(&mut self.defined);
        }
        let mut var_names: Vec<String> = vec![String::new(); f.vars.len()];
        for &p in &f.params {
            if let Some(slot) = var_names.get_mut(crate::ir::EntityId::index(p)) {
                *slot = names.fresh(&f.var(p).name);
            }
        }
        indent(out, level);
        if !nested && f.attrs.global_symbol.is_none() {
            out.push_str("@R.function(private=True)\n");
        } else {
            out.push_str("@R.function\n");
        }
        indent(out, level);
        let _ = write!(out, "def {name}(");
        for (i, &p) in f.params.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let pname = var_names
                .get(crate::ir::EntityId::index(p))
                .map_or("_", String::as_str);
            let _ = write!(out, "{pname}: ");
            write_type(out, &f.var(p).ty, true);
        }
        out.push_str(") -> ");
        write_type(out, &f.ret_ty, true);
        if has_prim(&f.ret_ty) || f.vars.iter().any(|(_, v)| has_prim(&v.ty)) {
            self.uses_tir = true;
        }
        out.push_str(":\n");
        let body = level + 1;
        for s in &syms {
            self.uses_tir = true;
            indent(out, body);
            let _ = writeln!(out, "{s} = T.int64()");
        }
        // Attributes, sorted by key.
        let a = &f.attrs;
        let mut entries: Vec<(&str, String)> = Vec::new();
        if let Some(c) = &a.composite {
            entries.push(("Composite", quote(c)));
        }
        if let Some(c) = &a.codegen {
            entries.push(("Codegen", quote(c)));
        }
        if let Some(p) = &a.primitive {
            entries.push(("Primitive", attr_value(p)));
        }
        if let Some(gs) = &a.global_symbol
            && (nested || gs != name)
        {
            entries.push(("global_symbol", quote(gs)));
        }
        for (k, v) in &a.extra {
            if !matches!(
                k.as_str(),
                "Composite" | "Codegen" | "Primitive" | "global_symbol"
            ) {
                entries.push((k.as_str(), attr_value(v)));
            }
        }
        entries.sort_by(|x, y| x.0.as_bytes().cmp(y.0.as_bytes()));
        if !entries.is_empty() {
            indent(out, body);
            out.push_str("R.func_attr({");
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{}: {v}", quote(k));
            }
            out.push_str("})\n");
        }
        let mut cls_here = cls_defined;
        if !cls_defined && uses_global(f) {
            indent(out, body);
            let _ = writeln!(out, "cls = {}", self.class_name);
            cls_here = true;
        }
        self.blocks(out, f, &f.blocks, body, names, &mut var_names, cls_here);
        indent(out, body);
        out.push_str("return ");
        match f.ret {
            Some(r) => self.expr(out, f, &var_names, r),
            None => out.push_str("()"),
        }
        out.push('\n');
        self.defined = outer_defined;
    }
}

/// Prints `m` as TVMScript; non-scalar constants are returned beside the text.
pub fn print_module(m: &Module) -> Printed {
    let valueless = m.valueless_constants();
    let first_index = valueless
        .iter()
        .filter(|c| &*c.ns == NS_CONSTANT)
        .map(|c| c.index as usize + 1)
        .max()
        .unwrap_or(0);
    let mut p = Printer {
        consts: Vec::new(),
        const_idx: HashMap::new(),
        first_index,
        uses_tir: false,
        class_name: "Module",
        defined: BTreeSet::new(),
    };
    let mut body = String::new();
    let names = m.sorted_names();
    for (i, name) in names.iter().enumerate() {
        let Some(f) = m.get(name) else { continue };
        if i > 0 {
            body.push('\n');
        }
        let mut scope = Names::default();
        p.function(&mut body, name, f, 1, false, &mut scope, false);
    }
    let mut text = String::with_capacity(body.len() + 256);
    text.push_str("# from tvm.script import ir as I\n");
    if p.uses_tir {
        text.push_str("# from tvm.script import tir as T\n");
    }
    text.push_str("# from tvm.script import relax as R\n\n@I.ir_module\nclass Module:\n");
    if names.is_empty() {
        text.push_str("    pass\n");
    }
    text.push_str(&body);
    if !p.consts.is_empty() || !valueless.is_empty() {
        text.push_str(
            "\n# Metadata omitted. Use show_meta=True in script() method to show this information.\n",
        );
    }
    Printed {
        text,
        constants: p.consts,
        first_index,
    }
}

#[cfg(test)]
mod tests {
    use super::format_float;

    #[test]
    fn floats_like_c_percent_17g() {
        assert_eq!(format_float(1e-05), "1.0000000000000001e-05");
        assert_eq!(format_float(0.1), "0.10000000000000001");
        assert_eq!(format_float(0.5), "0.5");
        assert_eq!(format_float(0.0), "0.0");
        assert_eq!(format_float(1.0), "1.0");
        assert_eq!(format_float(100.0), "100.0");
        assert_eq!(format_float(-2.5), "-2.5");
        assert_eq!(format_float(1e20), "1e+20");
        assert_eq!(format_float(f64::INFINITY), "inf");
        assert_eq!(format_float(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_float(f64::NAN), "nan");
        assert_eq!(format_float(123456789.0), "123456789.0");
        assert_eq!(format_float(1.5e16), "15000000000000000.0");
        assert_eq!(format_float(f64::from(0.1f32)), "0.10000000149011612");
    }
}
