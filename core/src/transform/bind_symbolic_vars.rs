//! BindSymbolicVars: give symbolic dims fixed values (TVM's `relax.transform.BindSymbolicVars`),
//! so that a model exported with dynamic axes (`batch`, `sequence`) can be specialised to one
//! shape, which the GPU backends need (they compile static shapes only).
//!
//! Contract:
//!
//! - Every symbol named in `binds` is replaced by its value in every function of the module:
//!   in the types of parameters, vars and expressions (tensor and shape types, nested in tuples
//!   and function types), in `R.shape([...])` literals, in return types, and in local functions;
//!   dim expressions fold (`batch * 128` with `batch = 2` becomes `256`). A bound symbol leaves
//!   the function's symbol list; other symbols stay as they were.
//! - Errors: a name that is no symbol of any function (a misspelt axis would otherwise bind
//!   nothing, silently), a value below 0, the same name bound twice. The result is verified
//!   ([`crate::ir::verify`]): a binding that contradicts a static dim is an error that names
//!   the function and var, not a module that fails later.
//!
//! ```text
//! ; before, binds {batch: 1, sequence: 128}
//! def main(input_ids: R.Tensor(("batch", "sequence"), dtype="int64")):
//!     batch = T.int64(); sequence = T.int64()
//!     lv: R.Tensor((batch, sequence, 768), dtype="float32") = R.take(emb, input_ids, axis=0)
//! ; after
//! def main(input_ids: R.Tensor((1, 128), dtype="int64")):
//!     lv: R.Tensor((1, 128, 768), dtype="float32") = R.take(emb, input_ids, axis=0)
//! ```

use crate::error::{Error, Result};
use crate::ir::{Dim, ExprKind, FuncType, Function, Module, Sym, TensorType, Type};
use std::collections::BTreeMap;

/// Binds the symbols named in `binds` (name, value) in every function of `m` (see the module
/// doc).
pub fn bind_symbolic_vars(m: &Module, binds: &[(String, i64)]) -> Result<Module> {
    let mut values: BTreeMap<Sym, i64> = BTreeMap::new();
    for (name, v) in binds {
        if *v < 0 {
            return Err(Error::Invalid(format!(
                "symbolic dim `{name}`: a dim cannot be {v} (expected a value of 0 or more)"
            )));
        }
        if values.insert(Sym::new(name), *v).is_some() {
            return Err(Error::Invalid(format!(
                "symbolic dim `{name}` is bound twice"
            )));
        }
    }
    let mut known = std::collections::BTreeSet::new();
    for f in m.functions.values() {
        collect_syms(f, &mut known);
    }
    if let Some(missing) = values.keys().find(|s| !known.contains(*s)) {
        let names: Vec<String> = known.iter().map(|s| format!("`{s}`")).collect();
        return Err(Error::Invalid(format!(
            "no function has a symbolic dim named `{missing}` (the module's: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )));
    }
    let value = |s: &Sym| values.get(s).copied();
    let mut out = m.clone();
    for f in out.functions.values_mut() {
        bind_function(f, &value);
    }
    crate::ir::verify::verify(&out).map_err(|e| {
        Error::Invalid(format!(
            "binding the symbolic dims made the module invalid: {e}"
        ))
    })?;
    Ok(out)
}

/// The symbols of `f`: its symbol list and every symbol in its types and shape literals.
fn collect_syms(f: &Function, out: &mut std::collections::BTreeSet<Sym>) {
    out.extend(f.sym_vars.iter().cloned());
    for (_, v) in f.vars.iter() {
        for_each_dim(&v.ty, &mut |d| d.collect_syms(out));
    }
    for (_, e) in f.exprs.iter() {
        for_each_dim(&e.ty, &mut |d| d.collect_syms(out));
        match &e.kind {
            ExprKind::ShapeLit(ds) => ds.iter().for_each(|d| d.collect_syms(out)),
            ExprKind::Function(inner) => collect_syms(inner, out),
            _ => {}
        }
    }
}

fn for_each_dim(t: &Type, f: &mut dyn FnMut(&Dim)) {
    match t {
        Type::Tensor(tt) => tt.dims.iter().flat_map(|d| d.iter()).for_each(f),
        Type::Shape { dims, .. } => dims.iter().flatten().for_each(f),
        Type::Tuple(ts) => ts.iter().for_each(|t| for_each_dim(t, f)),
        Type::Func(ft) => {
            ft.params.iter().for_each(|t| for_each_dim(t, f));
            for_each_dim(&ft.ret, f);
        }
        Type::Prim(_) | Type::Object => {}
    }
}

fn bind_function(f: &mut Function, value: &dyn Fn(&Sym) -> Option<i64>) {
    f.sym_vars.retain(|s| value(s).is_none());
    for (_, v) in f.vars.iter_mut() {
        v.ty = bind_type(&v.ty, value);
    }
    for (_, e) in f.exprs.iter_mut() {
        e.ty = bind_type(&e.ty, value);
        match &mut e.kind {
            ExprKind::ShapeLit(ds) => {
                for d in ds.iter_mut() {
                    *d = d.substitute(value);
                }
            }
            ExprKind::Function(inner) => bind_function(inner, value),
            _ => {}
        }
    }
    f.ret_ty = bind_type(&f.ret_ty, value);
}

fn bind_type(t: &Type, value: &dyn Fn(&Sym) -> Option<i64>) -> Type {
    match t {
        Type::Tensor(tt) => match &tt.dims {
            Some(dims) => {
                let mut nt: TensorType = tt.clone();
                nt.dims = Some(dims.iter().map(|d| d.substitute(value)).collect());
                Type::Tensor(nt)
            }
            None => t.clone(),
        },
        Type::Shape { dims, ndim } => Type::Shape {
            dims: dims
                .as_ref()
                .map(|ds| ds.iter().map(|d| d.substitute(value)).collect()),
            ndim: *ndim,
        },
        Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| bind_type(t, value)).collect()),
        Type::Func(ft) => Type::Func(FuncType {
            params: ft.params.iter().map(|t| bind_type(t, value)).collect(),
            ret: Box::new(bind_type(&ft.ret, value)),
        }),
        Type::Prim(_) | Type::Object => t.clone(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    const SRC: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("batch", "sequence", 4), dtype="float32"), w: R.Tensor((4, 8), dtype="float32")) -> R.Tensor(("batch * sequence", 8), dtype="float32"):
        batch = T.int64()
        sequence = T.int64()
        with R.dataflow():
            lv: R.Tensor((batch * sequence, 4), dtype="float32") = R.reshape(x, R.shape([batch * sequence, 4]))
            gv: R.Tensor((batch * sequence, 8), dtype="float32") = R.matmul(lv, w, out_dtype="void")
            R.output(gv)
        return gv
"#;

    fn parse(src: &str) -> Module {
        crate::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn bound_symbols_become_static_everywhere_and_fold() {
        let m = parse(SRC);
        let b = bind_symbolic_vars(&m, &[("batch".into(), 2), ("sequence".into(), 3)])
            .unwrap_or_else(|e| panic!("{e}"));
        let text = crate::text::print_module(&b).text;
        assert!(
            text.contains(r#"x: R.Tensor((2, 3, 4), dtype="float32")"#),
            "{text}"
        );
        assert!(text.contains("R.shape([6, 4])"), "{text}");
        assert!(
            text.contains(r#"-> R.Tensor((6, 8), dtype="float32")"#),
            "{text}"
        );
        assert!(!text.contains("batch"), "{text}");
        assert!(!text.contains("sequence"), "{text}");
    }

    #[test]
    fn unbound_symbols_stay() {
        let m = parse(SRC);
        let b = bind_symbolic_vars(&m, &[("batch".into(), 1)]).unwrap_or_else(|e| panic!("{e}"));
        let text = crate::text::print_module(&b).text;
        assert!(
            text.contains(r#"x: R.Tensor((1, "sequence", 4), dtype="float32")"#),
            "{text}"
        );
        assert!(text.contains("R.shape([sequence, 4])"), "{text}");
        assert!(text.contains("sequence = T.int64()"), "{text}");
        assert!(!text.contains("batch"), "{text}");
    }

    #[test]
    fn unknown_negative_and_repeated_names_are_errors() {
        let m = parse(SRC);
        let e = bind_symbolic_vars(&m, &[("batsh".into(), 1)]).map(|_| ());
        let e = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("`batsh`") && e.contains("`batch`, `sequence`"),
            "{e}"
        );
        let e = bind_symbolic_vars(&m, &[("batch".into(), -1)]).map(|_| ());
        assert!(e.err().is_some_and(|e| e.to_string().contains("0 or more")));
        let e = bind_symbolic_vars(&m, &[("batch".into(), 1), ("batch".into(), 2)]).map(|_| ());
        assert!(
            e.err()
                .is_some_and(|e| e.to_string().contains("bound twice"))
        );
    }
}
