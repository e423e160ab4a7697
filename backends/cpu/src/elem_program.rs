//! Elementwise programs: a FuseOps group of `float32` elementwise ops run in one pass over its
//! output, instead of one full-size tensor and one pass over memory per op.
//!
//! A group (a `Primitive` function) compiles ([`compile`]) to a small register program: one
//! instruction per binding, each reading registers (earlier bindings), inputs (the function's
//! parameters and constants, broadcast to the output shape with numpy rules: full-shape,
//! per-channel, scalar, any broadcast) or, after a `conv2d` head, the convolution's output.
//! [`bind`] checks the run-time values and [`Bound::run`] evaluates the program over the output
//! in blocks of [`BLOCK`] elements (4 KiB per operand), blocks grouped into chunks spread over
//! [`crate::par`] threads: each instruction is applied to the whole block before the next (so
//! its loop vectorises, compiled through [`crate::simd::dispatch`]), intermediates live in
//! per-thread block buffers, and no full-size intermediate tensor is ever made. A group whose
//! first binding is a `conv2d` runs the convolution with the program as its epilogue: as the
//! convolution's own steps where the program is a chain of them ([`Bound::conv_steps`]: a
//! per-channel bias, a residual add, `relu`, `clip`, SiLU; the kernels apply them to their
//! sums in registers), else as [`crate::conv::Step::Program`], applied to each output tile
//! while it is in cache (on planes under [`EPILOGUE_MIN_ROW`] pixels, as one in-place pass
//! over the convolution's output instead; and as a pass of its own when the result is larger
//! than that output, as in a squeeze-and-excite block). A group whose first binding is a
//! `matmul` runs the `matmul` kernel, then the program in one pass over its output (in place
//! when the shapes allow). A group whose first binding is a `concat` of parameters and
//! constants runs the `concat` kernel likewise, then the program over its output. A program
//! without a head (or run after one) first runs the instructions that read only values smaller
//! than its result, once each at their own shape ([`hoist`]): a squeeze-and-excite gate is
//! computed per channel, not per element.
//!
//! Contract:
//!
//! - Covered ops: `add`, `subtract`, `multiply`, `divide`, `power`, `maximum`, `minimum`,
//!   `negative`, `abs`, `relu`, `exp`, `log`, `sqrt`, `rsqrt`, `tanh`, `sigmoid`, `erf`,
//!   `gelu`, `gelu_tanh`, `silu`, `clip` (number bounds), `astype` to `float32`, and the
//!   elementwise family's rounding / float-math ops (`floor`, `ceil`, `round`, `sign`, `sin` …
//!   `atanh`) and float `mod` / `floor_mod`; the first binding may instead be a `conv2d`, a
//!   `matmul` or a `concat` of parameters or constants (the head). Layout ops and
//!   `gather_elements` of parameters and constants are read in place as views of them
//!   (`elem_view.rs`: a strided or gathered read per block, no tensor made). [`compile`] returns `None` for a function
//!   with any other binding, fewer than two bindings, or a result that is not its last
//!   binding, an instruction's.
//! - Bit-identity: each instruction computes exactly the scalar arithmetic of its op's
//!   `float32` kernel (the same functions: [`crate::elementwise::sigmoid32`],
//!   [`crate::norm::erf32`], [`crate::elementwise::gelu32`], the `relu` select, `f32::max`
//!   / `f32::min`, operand order kept for NaN payloads; the `f64` ops of `elem.rs` through the
//!   same `f64` functions, rounded once; the reference's row kernels, `erf32_row` and
//!   GELU's, run the same scalar functions in dispatched loops), and every element is
//!   computed by the same instructions whichever block, chunk or thread it falls in (the
//!   loops compile for any instruction set, the same bits). So the result is bit for bit
//!   what the bindings give one by one, for every thread count; a NaN result is NaN there
//!   too, but its sign and payload are not pinned: Rust leaves them unspecified (LLVM may
//!   commute `a * b`, and with two NaN operands x86 returns the first's), and the reference
//!   kernels themselves differ there between their own vectorised and scalar paths.
//! - [`bind`] returns `None` (the executor then runs the bindings one by one, the reference
//!   path) unless every input is a `float32` tensor, every operand's shape broadcasts, every
//!   intermediate's shape broadcasts to the result's without changing it (so computing each
//!   op at the result's shape gives each element its value), and, for an epilogue, the
//!   result has the head's output shape (it writes in place).
//!
//! ```text
//! @R.function(private=True)
//! def fused_conv2d_add_sigmoid_multiply(x: R.Tensor((1, 8, 16, 16), dtype="float32"),
//!         w: R.Tensor((48, 8, 1, 1), dtype="float32"), b: R.Tensor((1, 48, 1, 1), dtype="float32")):
//!     R.func_attr({"Primitive": True})
//!     with R.dataflow():
//!         lv = R.nn.conv2d(x, w)
//!         lv1 = R.add(lv, b)
//!         lv2 = R.sigmoid(lv1)
//!         gv = R.multiply(lv1, lv2)
//!         R.output(gv)
//!     return gv
//! ```
//!
//! compiles to (`h`: the convolution's output tile; `in0`: `b`, one value per channel here;
//! `out`: the tile, overwritten in place):
//!
//! ```text
//! r0  = add(h, in0)
//! out = silu(r0)      ; sigmoid(r0), then multiply(r0, ·): one instruction (`fuse_silu`)
//! ```
//!
//! and, `in0` being one value per channel, runs as `conv2d_fused(x, w, [Step::Bias(in0),
//! Step::Silu])` ([`Bound::conv_steps`]; a program of another form as `[Step::Program(..)]`),
//! profiled as one kernel `relax.nn.conv2d+relax.add+relax.sigmoid+relax.multiply`.

use crate::conv::Step;
use crate::elem_view::{Feed, Operand};
use crate::elementwise::{BinOp, f32_op, gelu_tanh32, gelu32, sigmoid32, silu32};
use crate::norm::erf32;
use crate::util::broadcast_shapes;
use fusebox_core::ir::{ExprId, ExprKind, Function, VarId};
use fusebox_core::op::{Conv2dAttrs, ElemClass, ElemOp, Op};
use fusebox_core::runtime::Tensor;
use std::cell::RefCell;
use std::sync::Arc;

/// Elements per block: each operand's block is 4 KiB, so a program's registers stay in L1/L2.
pub(crate) const BLOCK: usize = 1024;

/// Elements per task of a program run alone (a multiple of [`BLOCK`]).
const CHUNK: usize = 8 * BLOCK;

/// The fewest output pixels per channel (`OH · OW`) for which a `conv2d` head runs the program
/// as its epilogue (a call per row of one channel); below, the program makes one in-place
/// pass over the convolution's output, which is still in cache.
pub(crate) const EPILOGUE_MIN_ROW: usize = 256;

/// The most dims an input may keep after merging (a broadcast of more runs op by op).
pub(crate) const MAX_DIMS: usize = 8;

/// A unary instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Un {
    Neg,
    Abs,
    Relu,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Erf,
    Gelu,
    GeluTanh,
    Silu,
    /// `clip` of `float32` data with its bounds as the kernel reads them (`f64`, then `f32`).
    Clip {
        lo: f32,
        hi: f32,
    },
    /// `astype(x, "float32")` of `float32` data: the value itself.
    Copy,
    /// A rounding or float-math op of `elem.rs`: its `f64` function, rounded to `f32`.
    Wide(ElemOp),
}

/// A binary instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Bin {
    /// The broadcasting arithmetic of `elementwise.rs` (its `f32` function).
    Arith(BinOp),
    /// Float `mod` (`floor`: `floor_mod`) of `elem.rs`, in `f64` rounded to `f32`.
    Mod { floor: bool },
}

/// An instruction's operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Un(Un),
    Bin(Bin),
}

/// Where an operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Src {
    /// A register (an earlier binding's block).
    Reg(usize),
    /// Input `i` (see [`Program::leaves`]).
    In(usize),
    /// The head's (`conv2d`'s) output.
    Head,
}

/// Where an instruction writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dst {
    Reg(usize),
    Out,
}

/// One instruction: `dst = kind(a[, b])`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Inst {
    kind: Kind,
    a: Src,
    b: Option<Src>,
    dst: Dst,
}

/// A value the program reads from outside: a parameter of the function or a constant (the
/// composites' inputs, read the same way).
pub(crate) use crate::composite::Leaf;

/// A first binding whose output the program reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Head {
    /// `conv2d(data, weight)`: the program runs as the convolution's epilogue.
    Conv {
        data: Leaf,
        weight: Leaf,
        attrs: Conv2dAttrs,
    },
    /// `matmul(lhs, rhs)` (`op`): computed by its kernel, then the program in one pass over
    /// its output.
    Matmul { op: Op, lhs: Leaf, rhs: Leaf },
    /// `concat((parts..), axis)`: computed by its kernel, then the program in one pass over its
    /// output (DenseNet's batch norm and ReLU after each concatenation, which ran op by op).
    Concat { op: Op, parts: Vec<Leaf> },
}

/// A compiled elementwise program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Program {
    insts: Vec<Inst>,
    /// Registers in use at once (after reuse).
    nregs: usize,
    /// The values read from outside (tensors, and the shapes of views), in order of first
    /// use.
    pub leaves: Vec<Leaf>,
    /// The program's inputs (`Src::In`): leaves, read as they are or through views.
    pub feeds: Vec<Feed>,
    /// The ops' names joined by `+` (the head's first): the kernel's name in profiles.
    pub name: String,
}

/// A compiled group: an optional head (`conv2d`, `matmul`), then the program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Group {
    pub head: Option<Head>,
    pub prog: Program,
}

use crate::fuse::{op_call, prim_f32};

/// The instruction kind of an op call and how many of its arguments are operands.
fn kind_of(f: &Function, op: &Op, args: &[ExprId]) -> Option<(Kind, usize)> {
    let un = |u| Some((Kind::Un(u), 1));
    let bin = |b| Some((Kind::Bin(Bin::Arith(b)), 2));
    match op {
        Op::Add => bin(BinOp::Add),
        Op::Subtract => bin(BinOp::Sub),
        Op::Multiply => bin(BinOp::Mul),
        Op::Divide => bin(BinOp::Div),
        Op::Power => bin(BinOp::Pow),
        Op::Maximum => bin(BinOp::Max),
        Op::Minimum => bin(BinOp::Min),
        Op::Negative => un(Un::Neg),
        Op::Abs => un(Un::Abs),
        Op::Relu => un(Un::Relu),
        Op::Exp => un(Un::Exp),
        Op::Log => un(Un::Log),
        Op::Sqrt => un(Un::Sqrt),
        Op::Rsqrt => un(Un::Rsqrt),
        Op::Tanh => un(Un::Tanh),
        Op::Sigmoid => un(Un::Sigmoid),
        Op::Erf => un(Un::Erf),
        Op::Gelu => un(Un::Gelu),
        Op::GeluTanh => un(Un::GeluTanh),
        Op::Silu => un(Un::Silu),
        Op::Clip => match args {
            [_, lo, hi] => un(Un::Clip {
                lo: prim_f32(f, *lo)?,
                hi: prim_f32(f, *hi)?,
            }),
            _ => None,
        },
        Op::Astype {
            dtype: fusebox_core::ir::DType::F32,
        } => un(Un::Copy),
        Op::Elem(e) => match e.class() {
            ElemClass::Rounding | ElemClass::FloatMath => un(Un::Wide(*e)),
            ElemClass::Modulo => Some((
                Kind::Bin(Bin::Mod {
                    floor: *e == ElemOp::FloorMod,
                }),
                2,
            )),
            _ => None,
        },
        _ => None,
    }
}

/// Compiles `f` when it is an elementwise group (see the module doc): its bindings all
/// covered elementwise ops, or a `conv2d` of parameters/constants followed by such ops that
/// read its output; the result the last binding. `None` otherwise.
pub(crate) fn compile(f: &Function) -> Option<Group> {
    let bindings: Vec<_> = f.bindings().copied().collect();
    let last = bindings.last()?;
    let ret = match f.ret.and_then(|r| f.exprs.get(r)).map(|d| &d.kind) {
        Some(ExprKind::Var(v)) => *v,
        _ => return None,
    };
    if ret != last.var || bindings.len() < 2 {
        return None;
    }
    let leaf_of = |e: ExprId| Leaf::of(f, e);
    let mut rest = &bindings[..];
    let mut head = None;
    let mut head_var: Option<VarId> = None;
    let mut names: Vec<String> = Vec::new();
    match op_call(f, bindings[0].value) {
        Some((Op::Conv2d(attrs), [data, weight])) => {
            head = Some(Head::Conv {
                data: leaf_of(*data)?,
                weight: leaf_of(*weight)?,
                attrs: (**attrs).clone(),
            });
        }
        Some((op @ Op::Matmul { .. }, [lhs, rhs])) => {
            head = Some(Head::Matmul {
                op: op.clone(),
                lhs: leaf_of(*lhs)?,
                rhs: leaf_of(*rhs)?,
            });
        }
        Some((op @ Op::Concat { .. }, [tuple])) => {
            if let Some(ExprKind::Tuple(fields)) = f.exprs.get(*tuple).map(|d| &d.kind) {
                head = Some(Head::Concat {
                    op: op.clone(),
                    parts: fields
                        .iter()
                        .map(|&e| leaf_of(e))
                        .collect::<Option<Vec<_>>>()?,
                });
            }
        }
        _ => {}
    }
    if let (Some(_), Some((op, _))) = (&head, op_call(f, bindings[0].value)) {
        head_var = Some(bindings[0].var);
        names.push(op.name().to_string());
        rest = &bindings[1..];
    }
    // Virtual registers: one per instruction, in order; views (layout ops and gathers of
    // leaves, `elem_view.rs`) make no instruction.
    let mut leaves: Vec<Leaf> = Vec::new();
    let mut feeds: Vec<Feed> = Vec::new();
    let mut views: Vec<(VarId, Feed)> = Vec::new();
    let mut regs: Vec<VarId> = Vec::new();
    let mut code: Vec<(Kind, Src, Option<Src>)> = Vec::new();
    let leaf_index =
        |leaves: &mut Vec<Leaf>, leaf: Leaf| match leaves.iter().position(|l| *l == leaf) {
            Some(i) => i,
            None => {
                leaves.push(leaf);
                leaves.len() - 1
            }
        };
    let var_of = |e: ExprId| match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Var(v)) => Some(*v),
        _ => None,
    };
    for b in rest {
        let (op, args) = op_call(f, b.value)?;
        let Some((kind, arity)) = kind_of(f, op, args) else {
            // A view op of leaves and views, or nothing this covers.
            let mut operand = |e: ExprId| {
                if let Some(v) = var_of(e) {
                    if let Some((_, feed)) = views.iter().find(|(w, _)| *w == v) {
                        return Operand::Feed(feed.clone());
                    }
                    if Some(v) == head_var || regs.contains(&v) {
                        return Operand::Other;
                    }
                }
                match leaf_of(e) {
                    Some(l) => Operand::Feed(Feed::leaf(leaf_index(&mut leaves, l))),
                    None => Operand::Other,
                }
            };
            let feed = crate::elem_view::step_of(f, op, args, &mut operand)?;
            views.push((b.var, feed));
            names.push(op.name().to_string());
            continue;
        };
        let mut src = |e: ExprId| -> Option<Src> {
            let v = var_of(e);
            if v.is_some() && v == head_var {
                return Some(Src::Head);
            }
            if let Some(r) = regs.iter().position(|r| Some(*r) == v) {
                return Some(Src::Reg(r));
            }
            let feed = match views.iter().find(|(w, _)| Some(*w) == v) {
                Some((_, feed)) => feed.clone(),
                None => Feed::leaf(leaf_index(&mut leaves, leaf_of(e)?)),
            };
            let i = match feeds.iter().position(|x| *x == feed) {
                Some(i) => i,
                None => {
                    feeds.push(feed);
                    feeds.len() - 1
                }
            };
            Some(Src::In(i))
        };
        let a = src(*args.first()?)?;
        let b2 = if arity == 2 {
            Some(src(*args.get(1)?)?)
        } else {
            None
        };
        code.push((kind, a, b2));
        regs.push(b.var);
        names.push(op.name().to_string());
    }
    // The result is the last instruction's.
    if regs.last() != Some(&ret) {
        return None;
    }
    if code.is_empty() {
        return None;
    }
    let code = fuse_silu(code);
    let (insts, nregs) = allocate(&code);
    Some(Group {
        head,
        prog: Program {
            insts,
            nregs,
            leaves,
            feeds,
            name: names.join("+"),
        },
    })
}

/// `sigmoid(a)` followed by `multiply` of `a` and it (either order; nothing else reads the
/// sigmoid: the SiLU that exporters write as two nodes, after each of EfficientNet's
/// convolutions) as one `silu` instruction, `a · sigmoid32(a)`: the same product (of the
/// same two values; a NaN's payload aside, which the contract leaves open), one loop over
/// the block instead of two and a register block fewer. The virtual registers are renumbered
/// (each instruction's index).
fn fuse_silu(code: Vec<(Kind, Src, Option<Src>)>) -> Vec<(Kind, Src, Option<Src>)> {
    let reads = |r: usize| {
        code.iter()
            .flat_map(|(_, a, b)| [Some(*a), *b])
            .filter(|s| *s == Some(Src::Reg(r)))
            .count()
    };
    let mut out: Vec<(Kind, Src, Option<Src>)> = Vec::with_capacity(code.len());
    // Each instruction's index in `out` (`None`: fused into the next).
    let mut index: Vec<Option<usize>> = vec![None; code.len()];
    let remap = |s: Src, index: &[Option<usize>]| match s {
        Src::Reg(r) => index.get(r).copied().flatten().map(Src::Reg),
        s => Some(s),
    };
    let mut k = 0;
    while let Some(&(kind, a, b)) = code.get(k) {
        let silu = match (kind, code.get(k + 1)) {
            (Kind::Un(Un::Sigmoid), Some(&(Kind::Bin(Bin::Arith(BinOp::Mul)), p, Some(q)))) => {
                let s = Src::Reg(k);
                ((p, q) == (a, s) || (p, q) == (s, a)) && reads(k) == 1
            }
            _ => false,
        };
        let (kind, a, b, next) = match silu {
            true => (Kind::Un(Un::Silu), a, None, k + 1),
            false => (kind, a, b, k),
        };
        let b = match b {
            Some(b) => remap(b, &index).map(Some),
            None => Some(None),
        };
        let (Some(a), Some(b)) = (remap(a, &index), b) else {
            // Not reached: every register read is an earlier instruction's, kept.
            return code;
        };
        out.push((kind, a, b));
        index[next] = Some(out.len() - 1);
        k = next + 1;
    }
    out
}

/// Maps the virtual registers (one per instruction) to reused block buffers: an
/// instruction's destination is taken before its operands' registers are freed (so it never
/// aliases one), and the last instruction writes the output.
fn allocate(code: &[(Kind, Src, Option<Src>)]) -> (Vec<Inst>, usize) {
    let mut last_use: Vec<Option<usize>> = vec![None; code.len()];
    for (k, (_, a, b)) in code.iter().enumerate() {
        for s in [Some(*a), *b].into_iter().flatten() {
            if let Src::Reg(r) = s {
                last_use[r] = Some(k);
            }
        }
    }
    let mut phys: Vec<usize> = vec![0; code.len()];
    let mut free: Vec<usize> = Vec::new();
    let mut nregs = 0;
    let mut insts = Vec::with_capacity(code.len());
    let map = |s: Src, phys: &[usize]| match s {
        Src::Reg(r) => Src::Reg(phys[r]),
        s => s,
    };
    for (k, &(kind, a, b)) in code.iter().enumerate() {
        let (a, b) = (map(a, &phys), b.map(|b| map(b, &phys)));
        let dst = if k + 1 == code.len() {
            Dst::Out
        } else {
            let r = free.pop().unwrap_or_else(|| {
                nregs += 1;
                nregs - 1
            });
            phys[k] = r;
            Dst::Reg(r)
        };
        insts.push(Inst { kind, a, b, dst });
        for s in [Some(code[k].1), code[k].2].into_iter().flatten() {
            if let Src::Reg(r) = s
                && last_use[r] == Some(k)
                && !free.contains(&phys[r])
            {
                free.push(phys[r]);
            }
        }
        // A result nothing reads frees its register at once.
        if let Dst::Reg(r) = insts[k].dst
            && last_use[k].is_none()
        {
            free.push(r);
        }
    }
    (insts, nregs)
}

/// How an input is read for a range of the output.
#[derive(Clone, Debug)]
enum Access {
    /// One element for all (a scalar, or a tensor of one element).
    Scalar(f32),
    /// The output's own shape: element `i` of the output reads element `i`.
    Full,
    /// A broadcast or a layout view: (extent, stride) per merged dim of the output,
    /// outermost first.
    Strided(Vec<(usize, usize)>),
    /// A gathered view (`elem_view.rs`): (extent, [data stride, index stride]) per merged
    /// dim of the output, and the data offset each index element reads.
    Gathered {
        dims: Vec<(usize, [usize; 2])>,
        offsets: Vec<u32>,
    },
}

/// A program bound to run-time values: the inputs and the result's shape.
#[derive(Debug)]
pub(crate) struct Bound {
    prog: Program,
    inputs: Vec<(Tensor, Access)>,
    shape: Vec<usize>,
}

/// How an operand of shape `s` broadcast to `out` is read (`s` broadcasts to `out`).
fn access(s: &[usize], out: &[usize], data: &[f32]) -> Option<Access> {
    let numel: usize = out.iter().product();
    if data.len() == 1 {
        return Some(Access::Scalar(data[0]));
    }
    if data.len() == numel {
        return Some(Access::Full);
    }
    // Strides of `s` right-aligned to `out`, 0 where broadcast.
    let off = out.len().checked_sub(s.len())?;
    let mut strides = vec![0usize; out.len()];
    let mut acc = 1usize;
    for j in (0..s.len()).rev() {
        if s[j] != 1 {
            strides[off + j] = acc;
        }
        acc = acc.checked_mul(s[j])?;
    }
    let mut dims: Vec<(usize, usize)> = Vec::new();
    for (j, &e) in out.iter().enumerate() {
        if e == 1 {
            continue;
        }
        let st = strides[j];
        match dims.last_mut() {
            // The previous (outer) dim continues this one: merge them.
            Some((pe, ps)) if *ps == st * e => {
                *pe *= e;
                *ps = st;
            }
            _ => dims.push((e, st)),
        }
    }
    (dims.len() <= MAX_DIMS).then_some(Access::Strided(dims))
}

/// The result's shape of `prog` on inputs of `leaves` shapes (and a head's output of shape
/// `head`), when every operand broadcasts and every value (inputs, intermediates, the head's
/// output) broadcasts to the result without changing it; `None` otherwise.
fn result_shape(prog: &Program, leaves: &[&[usize]], head: Option<&[usize]>) -> Option<Vec<usize>> {
    // Physical registers are reused, so track the shape each currently holds.
    let mut regs: Vec<Vec<usize>> = vec![Vec::new(); prog.nregs];
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(prog.insts.len());
    let shape_of = |s: Src, regs: &[Vec<usize>]| -> Option<Vec<usize>> {
        match s {
            Src::Reg(r) => regs.get(r).cloned(),
            Src::In(i) => leaves.get(i).map(|s| s.to_vec()),
            Src::Head => head.map(<[usize]>::to_vec),
        }
    };
    for inst in &prog.insts {
        let a = shape_of(inst.a, &regs)?;
        let s = match inst.b {
            Some(b) => broadcast_shapes(&a, &shape_of(b, &regs)?).ok()?,
            None => a,
        };
        if let Dst::Reg(r) = inst.dst {
            *regs.get_mut(r)? = s.clone();
        }
        shapes.push(s);
    }
    let out = shapes.last()?.clone();
    let fits = |s: &[usize]| broadcast_shapes(s, &out).is_ok_and(|b| b == out);
    let all =
        shapes.iter().all(|s| fits(s)) && leaves.iter().all(|s| fits(s)) && head.is_none_or(fits);
    all.then_some(out)
}

/// Binds a program to run-time inputs (`leaves[i]` for [`Program::leaves`]`[i]`) and, after a
/// head, the head's output shape, which the result must have (the epilogue overwrites the
/// head's output); `None` when the values do not allow the one-pass run (see the module doc).
/// Without a head, the instructions that read only values smaller than the result run first,
/// once each at their own shape ([`hoist`]).
pub(crate) fn bind(prog: &Program, leaves: &[Tensor], head: Option<&[usize]>) -> Option<Bound> {
    if leaves.len() != prog.leaves.len() {
        return None;
    }
    if head.is_none()
        && let Some((p, all)) = hoist(prog, leaves)
    {
        return bind_whole(&p, &all, None);
    }
    bind_whole(prog, leaves, head)
}

/// [`bind`] with every instruction run at the result's shape.
fn bind_whole(prog: &Program, leaves: &[Tensor], head: Option<&[usize]>) -> Option<Bound> {
    if leaves.len() != prog.leaves.len() {
        return None;
    }
    let views = resolve_feeds(prog, leaves)?;
    let shapes: Vec<&[usize]> = views.iter().map(|(_, v)| v.shape.as_slice()).collect();
    let out = result_shape(prog, &shapes, head)?;
    if head.is_some_and(|h| h != out.as_slice()) {
        return None;
    }
    let inputs = prog
        .feeds
        .iter()
        .zip(views)
        .map(|(feed, (t, v))| {
            let data = t.as_f32()?;
            let acc = if feed.is_plain() {
                access(t.shape(), &out, data)?
            } else {
                view_access(v, &out, data.len())?
            };
            Some((t, acc))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Bound {
        prog: prog.clone(),
        inputs,
        shape: out,
    })
}

/// `prog` on `leaves` with the instructions that read only values smaller than the result
/// (plain inputs, and what such instructions computed) run first, each once at its own shape,
/// their results becoming inputs of the rest: a squeeze-and-excite gate, `sigmoid(add(s, b))`
/// on `(1, C, 1, 1)` values, then `multiply` by the `(1, C, H, W)` feature map, computes the
/// gate `C` times instead of `C·H·W` (EfficientNet-B0: 65 such blocks). Each runs the same
/// instruction on the same operand values ([`exec`], through a one-instruction [`Bound`]), so
/// every element of the result keeps its bits. `None` when nothing is hoisted or a value
/// does not fit (then the whole program runs at the result's shape).
fn hoist(prog: &Program, leaves: &[Tensor]) -> Option<(Program, Vec<Tensor>)> {
    // The first instruction hoisted reads inputs only: without one, nothing is (most groups:
    // no resolving of their feeds twice a call).
    let inputs_only = |i: &Inst| {
        [Some(i.a), i.b]
            .into_iter()
            .flatten()
            .all(|s| matches!(s, Src::In(_)))
    };
    if !prog.insts.iter().any(inputs_only) {
        return None;
    }
    let views = resolve_feeds(prog, leaves)?;
    let shapes: Vec<&[usize]> = views.iter().map(|(_, v)| v.shape.as_slice()).collect();
    let out = result_shape(prog, &shapes, None)?;
    let total: usize = out.iter().product();
    // Inputs after hoisting: the program's own feeds, then one plain feed per hoisted value.
    let mut feeds = prog.feeds.clone();
    let mut all: Vec<Tensor> = leaves.to_vec();
    let mut names = prog.leaves.clone();
    // What each physical register holds now, when a hoisted value: its input.
    let mut held: Vec<Option<usize>> = vec![None; prog.nregs];
    let mut insts = Vec::with_capacity(prog.insts.len());
    let mut hoisted = false;
    for inst in &prog.insts {
        let sub = |s: Src| match s {
            Src::Reg(r) => held.get(r).copied().flatten().map_or(s, Src::In),
            s => s,
        };
        let (a, b) = (sub(inst.a), inst.b.map(sub));
        // An operand's tensor, when it is a plain input (its data as the op reads it).
        let plain = |s: Src| match s {
            Src::In(i) if feeds.get(i).is_some_and(Feed::is_plain) => {
                all.get(feeds[i].base).cloned()
            }
            _ => None,
        };
        let small = match (plain(a), b.map(plain)) {
            (Some(x), None) => Some(vec![x]),
            (Some(x), Some(Some(y))) => Some(vec![x, y]),
            _ => None,
        };
        let value = small.and_then(|ops| {
            let shape = match ops.as_slice() {
                [x] => x.shape().to_vec(),
                [x, y] => broadcast_shapes(x.shape(), y.shape()).ok()?,
                _ => return None,
            };
            if shape.iter().product::<usize>() >= total || inst.dst == Dst::Out {
                return None;
            }
            let one = Program {
                insts: vec![Inst {
                    kind: inst.kind,
                    a: Src::In(0),
                    b: b.map(|_| Src::In(ops.len() - 1)),
                    dst: Dst::Out,
                }],
                nregs: 0,
                leaves: vec![Leaf::Param(usize::MAX); ops.len()],
                feeds: (0..ops.len()).map(Feed::leaf).collect(),
                name: prog.name.clone(),
            };
            bind_whole(&one, &ops, None)?.run().ok()
        });
        match (value, inst.dst) {
            (Some(v), Dst::Reg(r)) => {
                all.push(v);
                names.push(Leaf::Param(usize::MAX));
                feeds.push(Feed::leaf(all.len() - 1));
                *held.get_mut(r)? = Some(feeds.len() - 1);
                hoisted = true;
            }
            _ => {
                if let Dst::Reg(r) = inst.dst {
                    *held.get_mut(r)? = None;
                }
                insts.push(Inst { a, b, ..*inst });
            }
        }
    }
    if !hoisted {
        return None;
    }
    // Only the feeds the remaining instructions read: a block gathers every input it has,
    // read or not (the gate's operands, once hoisted, are not).
    let mut used = vec![false; feeds.len()];
    for inst in &insts {
        for s in [Some(inst.a), inst.b].into_iter().flatten() {
            if let Src::In(i) = s {
                *used.get_mut(i)? = true;
            }
        }
    }
    let mut index = vec![usize::MAX; feeds.len()];
    let mut kept = Vec::new();
    for (i, feed) in feeds.into_iter().enumerate() {
        if used[i] {
            index[i] = kept.len();
            kept.push(feed);
        }
    }
    for inst in &mut insts {
        for s in [Some(&mut inst.a), inst.b.as_mut()].into_iter().flatten() {
            if let Src::In(i) = s {
                *i = index[*i];
            }
        }
    }
    Some((
        Program {
            insts,
            nregs: prog.nregs,
            leaves: names,
            feeds: kept,
            name: prog.name.clone(),
        },
        all,
    ))
}

/// Each feed's data (a `float32` leaf) and its view resolved (`elem_view::resolve`); `None`
/// when one does not fit.
fn resolve_feeds(
    prog: &Program,
    leaves: &[Tensor],
) -> Option<Vec<(Tensor, crate::elem_view::Resolved)>> {
    prog.feeds
        .iter()
        .map(|feed| {
            let t = leaves.get(feed.base)?;
            t.as_f32()?;
            Some((t.clone(), crate::elem_view::resolve(feed, leaves)?))
        })
        .collect()
}

/// How a view is read at the result's shape `out`, every read checked to lie within the
/// data (`n` elements) and the index offsets.
fn view_access(v: crate::elem_view::Resolved, out: &[usize], n: usize) -> Option<Access> {
    use crate::elem_view::{merge_dims, strides_at};
    let ds = strides_at(&v.shape, &v.strides, out)?;
    let last = |dims: &[(usize, [usize; 2])], k: usize| -> usize {
        dims.iter().map(|(e, s)| (e - 1) * s[k]).sum()
    };
    match v.gather {
        None => {
            let dims = merge_dims(out, [&ds, &ds]);
            if dims.len() > MAX_DIMS || n == 0 || last(&dims, 0) >= n {
                return None;
            }
            Some(Access::Strided(
                dims.into_iter().map(|(e, s)| (e, s[0])).collect(),
            ))
        }
        Some(g) => {
            let is = strides_at(&v.shape, &g.strides, out)?;
            let dims = merge_dims(out, [&ds, &is]);
            let top = *g.offsets.iter().max()? as usize;
            if dims.len() > MAX_DIMS
                || last(&dims, 1) >= g.offsets.len()
                || last(&dims, 0).checked_add(top)? >= n
            {
                return None;
            }
            Some(Access::Gathered {
                dims,
                offsets: g.offsets,
            })
        }
    }
}

/// Whether a program whose result is larger than its head's output (shape `head`: a
/// squeeze-and-excite block's `conv2d` on pooled values, then `multiply` by the feature map)
/// can run after the head on these inputs, the head's output read as one more input
/// ([`bind_after`]).
pub(crate) fn fits_after(prog: &Program, leaves: &[Tensor], head: &[usize]) -> bool {
    if leaves.len() != prog.leaves.len() {
        return false;
    }
    let Some(views) = resolve_feeds(prog, leaves) else {
        return false;
    };
    let shapes: Vec<&[usize]> = views.iter().map(|(_, v)| v.shape.as_slice()).collect();
    result_shape(prog, &shapes, Some(head)).is_some()
}

/// Binds a program to its inputs and its head's output `head` (computed already), read as one
/// more input broadcast to the result: the program then runs as its own pass ([`Bound::run`]).
pub(crate) fn bind_after(prog: &Program, leaves: &[Tensor], head: Tensor) -> Option<Bound> {
    let n = prog.feeds.len();
    let mut p = prog.clone();
    let map = |s: &mut Src| {
        if *s == Src::Head {
            *s = Src::In(n);
        }
    };
    for inst in &mut p.insts {
        map(&mut inst.a);
        if let Some(b) = &mut inst.b {
            map(b);
        }
    }
    let mut all = leaves.to_vec();
    all.push(head);
    p.feeds.push(Feed::leaf(leaves.len()));
    // A placeholder: the executor reads `Program::leaves` of the compiled program, not of
    // this one, which only `bind` sees (it counts them).
    p.leaves.push(Leaf::Param(usize::MAX));
    bind(&p, &all, None)
}

/// A block operand: a slice of the block's length, or one value for all of it.
#[derive(Clone, Copy)]
enum Opnd<'a> {
    S(&'a [f32]),
    C(f32),
}

/// A thread's block buffers.
struct Scratch {
    regs: Vec<Vec<f32>>,
    /// Gathered blocks of broadcast inputs, and whether one is constant over the block.
    bufs: Vec<Vec<f32>>,
    consts: Vec<Option<f32>>,
    /// The head's block (the epilogue overwrites the tile it reads).
    head: Vec<f32>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            regs: Vec::new(),
            bufs: Vec::new(),
            consts: Vec::new(),
            head: Vec::new(),
        }
    }

    /// Makes room for `nregs` registers and `ninputs` inputs (buffers are only ever grown).
    #[inline]
    fn fit(&mut self, nregs: usize, ninputs: usize) {
        if self.regs.len() >= nregs && self.bufs.len() >= ninputs && !self.head.is_empty() {
            return;
        }
        let grow = |v: &mut Vec<Vec<f32>>, n: usize| {
            if v.len() < n {
                v.resize_with(n, Vec::new);
            }
            for b in v.iter_mut().take(n) {
                if b.len() < BLOCK {
                    b.resize(BLOCK, 0.0);
                }
            }
        };
        grow(&mut self.regs, nregs);
        grow(&mut self.bufs, ninputs);
        if self.consts.len() < ninputs {
            self.consts.resize(ninputs, None);
        }
        if self.head.len() < BLOCK {
            self.head.resize(BLOCK, 0.0);
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
}

/// Gathers `buf.len()` elements of a broadcast input starting at output element `at`;
/// returns the value instead when they are all the same element (a per-channel value over
/// a tile of one channel).
#[inline(always)]
fn gather(dims: &[(usize, usize)], data: &[f32], at: usize, buf: &mut [f32]) -> Option<f32> {
    let Some(&(_, is)) = dims.last() else {
        return data.first().copied();
    };
    let len = buf.len();
    if let [outer @ .., (m, 0), (k, 1)] = dims
        && *k < len
        && gather_periodic(outer, (*m, *k), data, at, buf)
    {
        return None;
    }
    let mut konst = None;
    crate::elem_view::for_each_run(dims.iter().map(|d| d.0), at, len, |done, run, idx| {
        let o: usize = dims.iter().zip(idx).map(|(&(_, s), &i)| i * s).sum();
        let dst = &mut buf[done..done + run];
        match is {
            // One run over the whole block of a broadcast dim: one value for all of it.
            0 if run == len => konst = data.get(o).copied(),
            0 => dst.fill(data.get(o).copied().unwrap_or(0.0)),
            1 => dst.copy_from_slice(&data[o..o + run]),
            s => dst
                .iter_mut()
                .enumerate()
                .for_each(|(k, d)| *d = data[o + k * s]),
        }
    });
    konst
}

/// [`gather`] for dims ending in a run of `k` consecutive values repeated `m` times (a
/// per-channel operand `(1, C/16, 1, 1, 16)` over an `NCHW16c` value: 16 values repeated over
/// each plane): each stretch of the block under one outer index is the run repeated, written by
/// doubling copies instead of one call per run of `k`. `false` where the data does not hold a
/// run the dims read (the caller then gathers the block run by run, overwriting it).
fn gather_periodic(
    outer: &[(usize, usize)],
    (m, k): (usize, usize),
    data: &[f32],
    at: usize,
    buf: &mut [f32],
) -> bool {
    let span = m * k;
    if k == 0 || span == 0 {
        return false;
    }
    let mut done = 0;
    while done < buf.len() {
        let g = at + done;
        let within = g % span;
        let n = (span - within).min(buf.len() - done);
        let mut rest = g / span;
        let mut o = 0;
        for &(e, st) in outer.iter().rev() {
            o += (rest % e.max(1)) * st;
            rest /= e.max(1);
        }
        let Some(src) = data.get(o..o + k) else {
            return false;
        };
        let dst = &mut buf[done..done + n];
        // The run from the phase the stretch starts at, then copies of what is written.
        let phase = within % k;
        let first = (k - phase).min(n);
        dst[..first].copy_from_slice(&src[phase..phase + first]);
        if first < n {
            dst[first..first + phase.min(n - first)].copy_from_slice(&src[..phase.min(n - first)]);
            let mut have = first + phase.min(n - first);
            // `have` is a whole number of periods from here on: the start repeats there.
            while have < n {
                let c = have.min(n - have);
                dst.copy_within(..c, have);
                have += c;
            }
        }
        done += n;
    }
    true
}

/// `d = f(a)` over a block.
#[inline(always)]
fn un_loop(d: &mut [f32], a: Opnd<'_>, f: impl Fn(f32) -> f32) {
    match a {
        Opnd::S(x) => d.iter_mut().zip(x).for_each(|(d, &v)| *d = f(v)),
        Opnd::C(v) => d.fill(f(v)),
    }
}

/// `d = f(a, b)` over a block, in the op's operand order.
#[inline(always)]
fn bin_loop(d: &mut [f32], a: Opnd<'_>, b: Opnd<'_>, f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (Opnd::S(x), Opnd::S(y)) => d
            .iter_mut()
            .zip(x)
            .zip(y)
            .for_each(|((d, &p), &q)| *d = f(p, q)),
        (Opnd::S(x), Opnd::C(q)) => d.iter_mut().zip(x).for_each(|(d, &p)| *d = f(p, q)),
        (Opnd::C(p), Opnd::S(y)) => d.iter_mut().zip(y).for_each(|(d, &q)| *d = f(p, q)),
        (Opnd::C(p), Opnd::C(q)) => d.fill(f(p, q)),
    }
}

/// One instruction over a block: the arithmetic of its op's `float32` kernel.
#[inline(always)]
fn exec(kind: Kind, d: &mut [f32], a: Opnd<'_>, b: Opnd<'_>) {
    match kind {
        Kind::Un(u) => match u {
            Un::Neg => un_loop(d, a, |x| -x),
            Un::Abs => un_loop(d, a, f32::abs),
            Un::Relu => un_loop(d, a, crate::conv::relu),
            Un::Exp => un_loop(d, a, f32::exp),
            Un::Log => un_loop(d, a, f32::ln),
            Un::Sqrt => un_loop(d, a, f32::sqrt),
            Un::Rsqrt => un_loop(d, a, |x| 1.0 / x.sqrt()),
            Un::Tanh => un_loop(d, a, f32::tanh),
            Un::Sigmoid => un_loop(d, a, sigmoid32),
            Un::Erf => un_loop(d, a, erf32),
            Un::Gelu => un_loop(d, a, gelu32),
            Un::GeluTanh => un_loop(d, a, gelu_tanh32),
            Un::Silu => un_loop(d, a, silu32),
            Un::Clip { lo, hi } => un_loop(d, a, |x| x.max(lo).min(hi)),
            Un::Copy => un_loop(d, a, |x| x),
            Un::Wide(op) => {
                let f = crate::elem::float_fn(op);
                un_loop(d, a, |x| f(f64::from(x)) as f32);
            }
        },
        Kind::Bin(Bin::Arith(op)) => match op {
            BinOp::Add => bin_loop(d, a, b, |p, q| p + q),
            BinOp::Sub => bin_loop(d, a, b, |p, q| p - q),
            BinOp::Mul => bin_loop(d, a, b, |p, q| p * q),
            BinOp::Div => bin_loop(d, a, b, |p, q| p / q),
            BinOp::Max => bin_loop(d, a, b, f32::max),
            BinOp::Min => bin_loop(d, a, b, f32::min),
            BinOp::Pow => bin_loop(d, a, b, f32_op(BinOp::Pow)),
        },
        Kind::Bin(Bin::Mod { floor }) => bin_loop(d, a, b, |p, q| {
            crate::elem::float_mod(f64::from(p), f64::from(q), floor) as f32
        }),
    }
}

impl Bound {
    /// The result's shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The program's name in profiles.
    pub(crate) fn name(&self) -> &str {
        &self.prog.name
    }

    /// Runs the program (no head) over the whole output, in chunks on the kernel threads.
    pub(crate) fn run(&self) -> Result<Tensor, String> {
        let n: usize = self.shape.iter().product();
        let t = crate::par::threads_for(n, 2 * CHUNK);
        let mut out = crate::par::scratch_f32(n);
        crate::par::for_each_chunk_mut(&mut out, CHUNK, t, |off, c| self.eval(off, c, false));
        out.into_tensor(self.shape.clone())
    }

    /// The program after a `conv2d` head as the convolution epilogue's own steps, where it
    /// is a chain of them: each instruction reads the value before it (the head's output
    /// first) and at most one plain input, and is an `add` of one value per channel or of a
    /// scalar ([`Step::Bias`]), an `add` of a tensor of the result's shape
    /// ([`Step::Residual`]), `relu`, `clip` or `silu` (EfficientNet's `add(conv, b)` then
    /// SiLU). The kernels then apply them to their sums in registers or to each row without a
    /// program call; each step computes its element with the instruction's operation, in its
    /// operand order (the same bits). `None` for any other program, or a result that is
    /// neither `(N, C, H, W)` nor `(N, C/b, H, W, b)` (a split layout, `NCHW16c`).
    pub(crate) fn conv_steps(&self) -> Option<Vec<Step>> {
        let channels = match *self.shape.as_slice() {
            [_, c, _, _] => c,
            [_, c, _, _, b] => c.checked_mul(b)?,
            _ => return None,
        };
        let last = self.prog.insts.len().checked_sub(1)?;
        let mut prev = Src::Head;
        let mut steps = Vec::with_capacity(last + 1);
        for (k, inst) in self.prog.insts.iter().enumerate() {
            steps.push(match (inst.kind, inst.b) {
                (Kind::Un(u), None) if inst.a == prev => match u {
                    Un::Relu => Step::Relu,
                    Un::Clip { lo, hi } => Step::Clip { lo, hi },
                    Un::Silu => Step::Silu,
                    _ => return None,
                },
                (Kind::Bin(Bin::Arith(BinOp::Add)), Some(b)) => match (inst.a, b) {
                    (a, Src::In(i)) if a == prev => self.add_step(i, channels, true)?,
                    (Src::In(i), b) if b == prev => self.add_step(i, channels, false)?,
                    _ => return None,
                },
                _ => return None,
            });
            prev = match inst.dst {
                Dst::Reg(r) if k < last => Src::Reg(r),
                Dst::Out if k == last => Src::Head,
                _ => return None,
            };
        }
        Some(steps)
    }

    /// Input `i` added to the value before it (`prev_first`: `prev + input`) as a step of
    /// [`Bound::conv_steps`], for a result of `channels` channels.
    fn add_step(&self, i: usize, channels: usize, prev_first: bool) -> Option<Step> {
        if !self.prog.feeds.get(i)?.is_plain() {
            return None;
        }
        let (t, access) = self.inputs.get(i)?;
        let data = t.as_f32()?;
        let per_channel = |b: Vec<f32>| Step::Bias {
            b,
            bias_first: !prev_first,
        };
        // A per-channel input has the result's channel dims (right-aligned: dim 1 of `(N, C,
        // H, W)`, dims 1 and 4 of `(N, C/b, H, W, b)`, whose values are then in channel
        // order) and 1 elsewhere.
        let shape = t.shape();
        let off = self.shape.len().checked_sub(shape.len())?;
        let on_channels = data.len() == channels
            && shape.iter().enumerate().all(|(j, &e)| match off + j {
                d @ (1 | 4) => e == self.shape[d],
                _ => e == 1,
            });
        match access {
            Access::Scalar(v) => Some(per_channel(vec![*v; channels])),
            Access::Full if shape == self.shape.as_slice() => Some(Step::Residual {
                r: t.clone(),
                prev_first,
            }),
            _ if on_channels => Some(per_channel(data.to_vec())),
            _ => None,
        }
    }

    /// The epilogue of a head: `row` holds the head's output for output elements
    /// `at..at + row.len()` and is overwritten with the program's result there.
    pub(crate) fn apply(&self, at: usize, row: &mut [f32]) {
        self.eval(at, row, true);
    }

    /// [`Bound::apply`] to the whole of `out` (the head's output, overwritten with the
    /// program's result), in chunks on the kernel threads: for a head whose epilogue rows
    /// would be too short to pay for a call each.
    pub(crate) fn apply_all(&self, out: &mut [f32]) {
        let t = crate::par::threads_for(out.len(), 2 * CHUNK);
        crate::par::for_each_chunk_mut(out, CHUNK, t, |off, c| self.eval(off, c, true));
    }

    /// Output elements `at..at + out.len()`, block by block, in a function compiled for the
    /// CPU's widest instruction set; with `head`, `out` holds the head's output on entry.
    fn eval(&self, at: usize, out: &mut [f32], head: bool) {
        struct Run<'a>(&'a Bound, usize, &'a mut [f32], bool, &'a mut Scratch);
        impl pulp::WithSimd for Run<'_> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, _: S) {
                let Run(b, at, out, head, scratch) = self;
                for (k, blk) in out.chunks_mut(BLOCK).enumerate() {
                    b.eval_block(at + k * BLOCK, blk, head, scratch);
                }
            }
        }
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut scratch) => {
                scratch.fit(self.prog.nregs, self.inputs.len());
                crate::simd::dispatch(Run(self, at, out, head, &mut scratch));
            }
            // Not reached (a program never runs inside another on one thread); kept safe.
            Err(_) => {
                let mut scratch = Scratch::new();
                scratch.fit(self.prog.nregs, self.inputs.len());
                crate::simd::dispatch(Run(self, at, out, head, &mut scratch));
            }
        });
    }

    /// One block (at most [`BLOCK`] elements) at output element `at`.
    #[inline(always)]
    fn eval_block(&self, at: usize, out: &mut [f32], head: bool, scratch: &mut Scratch) {
        let len = out.len();
        let Scratch {
            regs,
            bufs,
            consts,
            head: hbuf,
        } = scratch;
        if head {
            hbuf[..len].copy_from_slice(out);
        }
        for (i, (t, acc)) in self.inputs.iter().enumerate() {
            match (acc, t.as_f32()) {
                (Access::Strided(dims), Some(data)) => {
                    consts[i] = gather(dims, data, at, &mut bufs[i][..len]);
                }
                (Access::Gathered { dims, offsets }, Some(data)) => {
                    crate::elem_view::gather_offsets(dims, data, offsets, at, &mut bufs[i][..len]);
                    consts[i] = None;
                }
                _ => {}
            }
        }
        for inst in &self.prog.insts {
            let mut tmp = match inst.dst {
                Dst::Reg(r) => std::mem::take(&mut regs[r]),
                Dst::Out => Vec::new(),
            };
            {
                let ctx = Operands {
                    b: self,
                    regs,
                    bufs,
                    consts,
                    head: hbuf,
                    at,
                    len,
                };
                let d: &mut [f32] = match inst.dst {
                    Dst::Reg(_) => &mut tmp[..len],
                    Dst::Out => &mut *out,
                };
                let a = ctx.get(inst.a);
                let b = match inst.b {
                    Some(s) => ctx.get(s),
                    None => Opnd::C(0.0),
                };
                exec(inst.kind, d, a, b);
            }
            if let Dst::Reg(r) = inst.dst {
                regs[r] = tmp;
            }
        }
    }
}

/// What a block's operands are read from.
struct Operands<'a> {
    b: &'a Bound,
    regs: &'a [Vec<f32>],
    bufs: &'a [Vec<f32>],
    consts: &'a [Option<f32>],
    head: &'a [f32],
    at: usize,
    len: usize,
}

impl<'a> Operands<'a> {
    #[inline(always)]
    fn get(&self, s: Src) -> Opnd<'a> {
        let len = self.len;
        match s {
            Src::Reg(r) => Opnd::S(&self.regs[r][..len]),
            Src::Head => Opnd::S(&self.head[..len]),
            Src::In(i) => match &self.b.inputs[i] {
                (_, Access::Scalar(v)) => Opnd::C(*v),
                (t, Access::Full) => {
                    Opnd::S(t.as_f32().map_or(&[][..], |d| &d[self.at..self.at + len]))
                }
                (_, Access::Strided(_) | Access::Gathered { .. }) => match self.consts[i] {
                    Some(v) => Opnd::C(v),
                    None => Opnd::S(&self.bufs[i][..len]),
                },
            },
        }
    }
}

/// A bound program as a convolution epilogue step ([`crate::conv::Step::Program`]); steps
/// compare equal only when they are the same program.
#[derive(Clone, Debug)]
pub(crate) struct ProgramStep(pub Arc<Bound>);

impl PartialEq for ProgramStep {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
#[path = "elem_program_tests.rs"]
mod tests;
