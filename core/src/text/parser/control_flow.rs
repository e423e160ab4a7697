//! The parser's control flow: `if cond:` / `else:` blocks as TVM prints a Relax `If`
//! (`parser.rs` split along that seam). Each branch is its own scope of blocks (dataflow blocks
//! and nested `if`s allowed) ending with a binding of the `if`'s result; a value that is not a
//! leaf stays bound to `<name>_then` / `<name>_else`, as TVM's parser names it. Same contract
//! as the parser: every error is positioned, nothing user-written can panic or recurse without
//! bound.

use super::*;

impl<'a> Parser<'a> {
    /// `if cond:` / `else:`, each branch a sequence of blocks ending with a binding of the
    /// same var, the `if`'s result (as TVM prints a Relax `If`).
    pub(super) fn parse_if(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        let if_tok = self.peek();
        self.enter(if_tok)?;
        let r = self.parse_if_inner(ctx);
        self.leave();
        r
    }

    fn parse_if_inner(&mut self, ctx: &mut FnCtx<'a>) -> Result<()> {
        let if_tok = self.bump();
        if ctx.in_dataflow {
            return Err(self.err_at(
                if_tok,
                "`if` is not allowed inside a dataflow block (close the block first)",
            ));
        }
        let ct = self.peek();
        let cond = self.parse_expr(ctx)?;
        let cond = self.leafify(ctx, cond)?;
        let cty = &ctx.f.expr(cond).ty;
        if !crate::ir::infer::is_condition(cty) {
            return Err(self.err_at(
                ct,
                format!(
                    "the condition of `if` must be a bool scalar (R.Tensor((), dtype=\"bool\") or T.bool), found {}",
                    brief(cty)
                ),
            ));
        }
        self.expect(Tk::Colon, "after the condition of `if`")?;
        self.expect_newline("`if ...:`")?;
        self.expect(Tk::Indent, "(an indented `if` branch)")?;
        let (then_branch, then_res) = self.parse_branch(ctx, "if")?;
        self.skip_newlines();
        let et = self.peek();
        if !self.is_ident(et, "else") {
            return Err(self.err_at(
                et,
                format!(
                    "expected `else:` at the indentation of its `if` (a Relax `if` needs both branches), found {}",
                    self.describe(et)
                ),
            ));
        }
        self.bump();
        self.expect(Tk::Colon, "after `else`")?;
        self.expect_newline("`else:`")?;
        self.expect(Tk::Indent, "(an indented `else` branch)")?;
        let (else_branch, else_res) = self.parse_branch(ctx, "else")?;
        if else_res.name != then_res.name {
            return Err(self.err_at(
                else_res.tok,
                format!(
                    "the `else` branch ends by binding `{}` but the `if` branch binds `{}`: both branches must end with a binding of the `if`'s result",
                    else_res.name, then_res.name
                ),
            ));
        }
        if let (Some(a), Some(b)) = (&then_res.ann, &else_res.ann)
            && a != b
        {
            return Err(self.err_at(
                else_res.tok,
                format!(
                    "the branches annotate `{}` differently: {} and {}",
                    then_res.name,
                    brief(a),
                    brief(b)
                ),
            ));
        }
        let name = then_res.name.clone();
        if ctx.scope.contains_key(name.as_str()) {
            return Err(self.err_at(then_res.tok, format!("duplicate definition of `{name}`")));
        }
        let kind = ExprKind::If(Box::new(crate::ir::IfExpr {
            cond,
            then_branch,
            else_branch,
        }));
        let e = self.add_expr(ctx, kind, if_tok)?;
        let inferred = ctx.f.expr(e).ty.clone();
        let annotated = then_res.ann.is_some() || else_res.ann.is_some();
        let ty = match then_res.ann.or(else_res.ann) {
            Some(ann) => {
                if !ann.accepts(&inferred) {
                    return Err(self.err_at(
                        then_res.tok,
                        format!(
                            "type mismatch: `{name}` is annotated {} but the branches yield {}",
                            brief(&ann),
                            brief(&inferred)
                        ),
                    ));
                }
                ann
            }
            None => inferred,
        };
        let ty = ctx.shapes.intern(ty);
        let v = ctx.f.add_var(name.clone(), ty, false);
        Self::emit(ctx, v, e);
        ctx.scope.insert(Cow::Owned(name), (v, true));
        ctx.last_name_tok = Some(then_res.tok);
        ctx.last_annotated = annotated;
        Ok(())
    }

    /// One branch, after its `Indent` and up to its `Dedent`: its own scope and blocks. The
    /// last binding (of a plain block, or an output of a closing dataflow block) gives the
    /// branch's body and the `if`'s result name: a leaf value is the body itself; another
    /// value stays bound, to `<name>_then` / `<name>_else` (as TVM's parser names it).
    fn parse_branch(
        &mut self,
        ctx: &mut FnCtx<'a>,
        kw: &str,
    ) -> Result<(crate::ir::Seq, BranchResult)> {
        let outer_blocks = std::mem::take(&mut ctx.f.blocks);
        // The branch's names leave scope with it (no name of the branch shadows an outer one:
        // a redefinition is an error), in time linear in what the branch bound.
        let first_var = ctx.f.vars.len();
        let r = self.parse_branch_inner(ctx, kw);
        let mut blocks = std::mem::replace(&mut ctx.f.blocks, outer_blocks);
        for idx in first_var..ctx.f.vars.len() {
            let v = <VarId as crate::ir::EntityId>::new(idx);
            let name = ctx.f.var(v).name.as_str();
            if ctx.scope.get(name).is_some_and(|e| e.0 == v) {
                ctx.scope.remove(name);
            }
        }
        let (last, res) = r?;
        let value = last.value;
        // A leaf becomes the branch's body, which lies outside the branch's blocks: it may not
        // name a dataflow var (`out = R.matmul(x, w),` in a dataflow block binds the call to a
        // dataflow `lv` and the tuple `(lv,)` to `out`, which then stays bound).
        let leaf = ctx
            .f
            .exprs
            .get(value)
            .is_some_and(|d| is_leaf(&d.kind) && !names_dataflow_var(&ctx.f, value));
        let body = if leaf {
            // The `if`'s own var (made by the caller) replaces this one: drop it, and it is
            // the last var and expression of the arenas.
            if let Some(b) = blocks.last_mut() {
                b.bindings.pop();
                if b.bindings.is_empty() {
                    blocks.pop();
                }
            }
            if crate::ir::EntityId::index(last.var) + 1 == ctx.f.vars.len()
                && crate::ir::EntityId::index(ctx.f.var_expr(last.var)) + 1 == ctx.f.exprs.len()
            {
                ctx.f.vars.pop();
                ctx.f.exprs.pop();
            }
            value
        } else {
            let side = if kw == "if" { "then" } else { "else" };
            let base = format!("{}_{side}", res.name);
            let mut name = base.clone();
            let mut n = 0u32;
            while ctx.scope.contains_key(name.as_str()) || self.lv_taken.contains(name.as_str()) {
                n = n.wrapping_add(1);
                name = format!("{base}{n}");
            }
            ctx.f.vars[last.var].name = name;
            ctx.f.var_expr(last.var)
        };
        Ok((crate::ir::Seq { blocks, body }, res))
    }

    fn parse_branch_inner(
        &mut self,
        ctx: &mut FnCtx<'a>,
        kw: &str,
    ) -> Result<(Binding, BranchResult)> {
        let mut last: Option<(Binding, BranchResult)> = None;
        loop {
            let t = self.peek();
            match t.kind {
                Tk::Dedent => {
                    self.bump();
                    break;
                }
                Tk::Eof => break,
                Tk::Newline => {
                    self.bump();
                }
                Tk::Indent => return Err(self.err_at(t, "unexpected indentation")),
                Tk::Ident if self.text(t) == "return" => {
                    return Err(self.err_at(
                        t,
                        format!("`return` is not allowed inside an `{kw}` branch"),
                    ));
                }
                _ => {
                    let nvars = ctx.f.vars.len();
                    ctx.last_name_tok = None;
                    self.parse_statement(ctx, t)?;
                    // The statement's last binding, when it made one of a var visible after
                    // its block (a plain binding, or an output of a dataflow block).
                    last = ctx
                        .f
                        .blocks
                        .last()
                        .and_then(|blk| blk.bindings.last())
                        .copied()
                        .filter(|b| {
                            crate::ir::EntityId::index(b.var) >= nvars
                                && !ctx.f.var(b.var).dataflow
                                && !matches!(ctx.f.expr(b.value).kind, ExprKind::Function(_))
                        })
                        .and_then(|b| {
                            let vd = ctx.f.var(b.var);
                            let tok = ctx.last_name_tok?;
                            let ann = ctx.last_annotated.then(|| vd.ty.clone());
                            Some((
                                b,
                                BranchResult {
                                    name: vd.name.clone(),
                                    tok,
                                    ann,
                                },
                            ))
                        });
                }
            }
        }
        last.ok_or_else(|| {
            let t = self.peek();
            self.err_at(
                t,
                format!(
                    "an `{kw}` branch must end with a binding of the `if`'s result (`name: type = value`, or an output of a dataflow block)"
                ),
            )
        })
    }
}

/// Whether a leaf expression names a dataflow var (itself, or a field of a tuple, nested).
fn names_dataflow_var(f: &crate::ir::Function, e: crate::ir::ExprId) -> bool {
    match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Var(v)) => f.var(*v).dataflow,
        Some(ExprKind::Tuple(xs)) => xs.iter().any(|&x| names_dataflow_var(f, x)),
        _ => false,
    }
}
