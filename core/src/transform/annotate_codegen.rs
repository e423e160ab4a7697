//! AnnotateCodegen: wrap every composite function called from an entry function in a public
//! function that names its codegen, as TVM's `annotate_codegen=True` of FuseOpsByPattern does.
//!
//! Contract:
//!
//! - Each composite (`Composite = "<codegen>.<name>"`) called from an entry function (no
//!   `Primitive`, `Composite` or `Codegen`) gets one wrapper `<composite name>_<codegen>`
//!   (numeric suffixes keep names unique) with `Codegen` and `global_symbol`, whose body binds
//!   the composite as `local_func` (without `Primitive` and `global_symbol`) and calls it on
//!   the wrapper's parameters; every call of the composite from an entry function calls the
//!   wrapper instead, and the composite itself leaves the module. Inside the branches of
//!   `if`s too (see [`super::regions`]).
//! - A composite name without a codegen prefix is an error naming it.
//!
//! ```text
//! ; before
//! gv = cls.fused_relax_nn_conv2d_relax_nn_relu(data, weight1)
//! ; after
//! @R.function
//! def fused_relax_nn_conv2d_relax_nn_relu_dnnl(data: ..., weight1: ...) -> ...:
//!     R.func_attr({"Codegen": "dnnl", "global_symbol": "fused_relax_nn_conv2d_relax_nn_relu_dnnl"})
//!     @R.function
//!     def local_func(data: ..., weight1: ...) -> ...:
//!         R.func_attr({"Composite": "dnnl.conv2d_relu"})
//!         ...
//!     output = local_func(data, weight1)
//!     return output
//! gv = cls.fused_relax_nn_conv2d_relax_nn_relu_dnnl(data, weight1)
//! ```

use super::fuse_ops_by_pattern::{codegen_of, is_entry};
use super::outline::unique_name;
use crate::error::{Error, Result};
use crate::ir::{Binding, Block, Callee, ExprKind, Function, Module, Type};
use rustc_hash::FxHashMap as HashMap;

/// Wraps every composite called from an entry function in a public `Codegen` function.
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn annotate_codegen(m: &Module) -> Result<Module> {
    super::regions::map_regions(m, annotate_codegen_flat)
}

fn annotate_codegen_flat(m: &Module) -> Result<Module> {
    let mut out = m.clone();
    let mut wrapper_of: HashMap<String, String> = HashMap::default();
    let entries: Vec<String> = m
        .functions
        .iter()
        .filter(|(_, f)| is_entry(f))
        .map(|(n, _)| n.clone())
        .collect();
    for fname in entries {
        let Some(f) = out.functions.get(&fname).cloned() else {
            continue;
        };
        let mut nf = f.clone();
        for (id, d) in f.exprs.iter() {
            let ExprKind::Call {
                callee: Callee::Global(g),
                args,
            } = &d.kind
            else {
                continue;
            };
            let Some(comp) = m.get(g) else { continue };
            let Some(cname) = comp.attrs.composite.clone() else {
                continue;
            };
            let wrapper = match wrapper_of.get(g.as_ref()) {
                Some(w) => w.clone(),
                None => {
                    let codegen = codegen_of(&cname).ok_or_else(|| {
                        Error::Invalid(format!(
                            "composite `{cname}` has no codegen prefix (expected `<codegen>.<name>`)"
                        ))
                    })?;
                    let base = format!("{g}_{codegen}");
                    let name = unique_name(&base, &|n| out.get(n).is_some());
                    let w = make_wrapper(comp, codegen, &name)?;
                    out.insert(name.clone(), w);
                    wrapper_of.insert(g.to_string(), name.clone());
                    name
                }
            };
            nf.exprs[id].kind = ExprKind::Call {
                callee: Callee::Global(wrapper.as_str().into()),
                args: args.clone(),
            };
        }
        out.insert(fname, nf);
    }
    for g in wrapper_of.keys() {
        out.functions.shift_remove(g);
    }
    Ok(out)
}

fn make_wrapper(comp: &Function, codegen: &str, name: &str) -> Result<Function> {
    let mut w = Function::new();
    let mut local = comp.clone();
    local.attrs.primitive = None;
    local.attrs.global_symbol = None;
    let mut args = Vec::new();
    for &p in &comp.params {
        let vd = comp.var(p);
        let np = w.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
        w.params.push(np);
        args.push(w.var_expr(np));
    }
    w.sym_vars = comp.sym_vars.clone();
    let fty = Type::Func(local.func_type());
    let fexpr = w.add_expr(ExprKind::Function(Box::new(local)), fty.clone());
    let lv = w.add_var("local_func", fty, false);
    let call = w.add_expr(
        ExprKind::Call {
            callee: Callee::Local(lv),
            args,
        },
        comp.ret_ty.clone(),
    );
    let ov = w.add_var("output", comp.ret_ty.clone(), false);
    w.blocks.push(Block {
        dataflow: false,
        bindings: vec![
            Binding {
                var: lv,
                value: fexpr,
            },
            Binding {
                var: ov,
                value: call,
            },
        ],
    });
    w.ret = Some(w.var_expr(ov));
    w.ret_ty = comp.ret_ty.clone();
    w.attrs.codegen = Some(codegen.to_string());
    w.attrs.global_symbol = Some(name.to_string());
    Ok(w)
}
