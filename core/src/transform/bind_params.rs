//! BindParams: replace named parameters of a function by constants.
//!
//! Requires a verified module; each bound constant must have the parameter's dtype and a shape
//! the parameter's type accepts. Guarantees: the parameter is gone and every use of it reads the
//! constant. Required for correctness of nothing; it enables `bind_constants`.
//!
//! ```text
//! ; before                                   ; after, with weight1 bound
//! def main(data: ..., weight1: ...):        def main(data: ...):
//!     lv = R.nn.conv2d(data, weight1)           lv = R.nn.conv2d(data, metadata["relax.expr.Constant"][0])
//! ```

use crate::error::{Error, Result};
use crate::ir::copy::copy_expr;
use crate::ir::infer::brief;
use crate::ir::{Binding, Block, Constant, ExprId, ExprKind, Function, Module, VarId};
use std::collections::HashMap;

/// Binds `params` (by name) of function `func` to constants.
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn bind_params(m: &Module, func: &str, params: &[(String, Constant)]) -> Result<Module> {
    super::regions::map_regions(m, |m| bind_params_flat(m, func, params))
}

fn bind_params_flat(m: &Module, func: &str, params: &[(String, Constant)]) -> Result<Module> {
    let f = m
        .get(func)
        .ok_or_else(|| Error::Invalid(format!("no function named `{func}`")))?;
    let mut nf = Function::new();
    nf.attrs = f.attrs.clone();
    nf.sym_vars = f.sym_vars.clone();
    nf.ret_ty = f.ret_ty.clone();
    let mut map: HashMap<VarId, ExprId> = HashMap::new();
    for (name, _) in params {
        if !f.params.iter().any(|&p| f.var(p).name == *name) {
            let names: Vec<&str> = f.params.iter().map(|&p| f.var(p).name.as_str()).collect();
            return Err(Error::Invalid(format!(
                "`{func}` has no parameter `{name}`; its parameters are: {}",
                names.join(", ")
            )));
        }
    }
    for &p in &f.params {
        let vd = f.var(p);
        match params.iter().find(|(n, _)| *n == vd.name) {
            Some((_, c)) => {
                if !vd.ty.accepts(&c.ty()) {
                    return Err(Error::Invalid(format!(
                        "cannot bind `{}`: the parameter is {} but the constant is {}",
                        vd.name,
                        brief(&vd.ty),
                        brief(&c.ty())
                    )));
                }
                let e = nf.add_expr(ExprKind::Const(c.clone()), c.ty());
                map.insert(p, e);
            }
            None => {
                let np = nf.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
                nf.params.push(np);
                map.insert(p, nf.var_expr(np));
            }
        }
    }
    for block in &f.blocks {
        let mut out = Block {
            dataflow: block.dataflow,
            bindings: Vec::new(),
        };
        for b in &block.bindings {
            let value = copy_expr(f, b.value, &mut nf, &map)?;
            let vd = f.var(b.var);
            let nv = nf.add_var_from(
                vd.name.clone(),
                vd.ty.clone(),
                vd.dataflow,
                vd.origin.clone(),
            );
            out.bindings.push(Binding { var: nv, value });
            map.insert(b.var, nf.var_expr(nv));
        }
        nf.blocks.push(out);
    }
    let ret = f
        .ret
        .ok_or_else(|| Error::Invalid(format!("`{func}` has no return")))?;
    nf.ret = Some(copy_expr(f, ret, &mut nf, &map)?);
    let mut out = m.clone();
    out.insert(func, nf);
    Ok(out)
}
