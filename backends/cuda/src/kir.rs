//! The kernel IR: what one fused CUDA kernel computes, independent of how it is printed.
//!
//! Contract:
//!
//! - A [`Kernel`] iterates over a coordinate *space* (static extents). Its value nodes live in
//!   a hash-consed DAG ([`Graph`]): coordinates, constants, loads from input buffers (row-major,
//!   one index node per buffer dim, always in range: padding is a [`Node::Select`] around a
//!   load at a clamped index), elementwise math, conversions through a storage dtype, and
//!   [`Node::Reduce`] (sum / max / min over reduction variables, evaluated per element).
//! - A *row kernel* splits the space into `row_axes` leading row coordinates and trailing column
//!   coordinates. Its [`Stat`]s are reductions over the whole row (softmax's max and sum,
//!   layer_norm's mean and variance, a `sum` over trailing axes), computed once per row in order,
//!   each may use the earlier ones ([`Node::Stat`]). A *map kernel* has `row_axes ==
//!   space.len()` and no stats.
//! - [`Store`]s write output buffers at the linear index of the coordinates (per element) or of
//!   the row coordinates (per row); an output's element count equals the space's (or the rows').
//! - Math is in `f32` for `f32`/`f16`/`bf16` data, `f64` for `f64`, `i64` for integers and
//!   `bool`; loads convert to the compute scalar, stores convert back (round to nearest even).
//! - A [`Schedule`] says how the space maps to threads: a grid-stride loop with a vector width,
//!   or a warp / a block per row.
//!
//! ```text
//! fused_add_layer_norm(a: [64, 768] f16, b: [64, 768] f16, g: [768] f16, h: [768] f16)
//!   space [64, 768], row_axes 1, block per row, 256 threads
//!   stat0 = sum(load a[c0,c1] + load b[c0,c1]) * (1/768)           (mean)
//!   stat1 = sum((a + b - stat0)^2) * (1/768)                        (variance)
//!   out0[c0,c1] = (a + b - stat0) * rsqrt(stat1 + 1e-5) * g[c1] + h[c1]
//! ```

use fusebox_core::ir::DType;
use std::collections::HashMap;

/// A node's index in its [`Graph`].
pub type NodeId = u32;

/// The scalar type arithmetic runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// `float` (for f32, f16, bf16 data).
    F32,
    /// `double`.
    F64,
    /// `long long` (integers, bool, indices).
    I64,
}

impl Scalar {
    /// The compute scalar of a storage dtype.
    pub fn of(d: DType) -> Scalar {
        match d {
            DType::F64 => Scalar::F64,
            d if d.is_float() => Scalar::F32,
            _ => Scalar::I64,
        }
    }
}

/// Unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Un {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// natural log.
    Log,
    /// square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// the error function.
    Erf,
    /// round down.
    Floor,
    /// round up.
    Ceil,
    /// round to nearest, ties to even.
    Round,
    /// `-1`, `0` or `1` (NaN stays NaN).
    Sign,
    /// sine.
    Sin,
    /// cosine.
    Cos,
    /// tangent.
    Tan,
    /// arc sine.
    Asin,
    /// arc cosine.
    Acos,
    /// arc tangent.
    Atan,
    /// hyperbolic sine.
    Sinh,
    /// hyperbolic cosine.
    Cosh,
    /// inverse hyperbolic sine.
    Asinh,
    /// inverse hyperbolic cosine.
    Acosh,
    /// inverse hyperbolic tangent.
    Atanh,
    /// `1` if NaN else `0`, in the operand's scalar (`0` for integers).
    IsNan,
    /// `1` if infinite else `0`, in the operand's scalar (`0` for integers).
    IsInf,
    /// `~x` (integers).
    BitNot,
}

/// Binary operations. Comparisons give `1` or `0` in the operands' scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bin {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (truncating on integers).
    Div,
    /// `a ^ b` (floats only).
    Pow,
    /// larger of the two.
    Max,
    /// smaller of the two.
    Min,
    /// `a < b`.
    Lt,
    /// `a mod b` on non-negative integers.
    Rem,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a <= b`.
    Le,
    /// `a & b` (integers).
    BitAnd,
    /// `a | b` (integers).
    BitOr,
    /// `a ^ b` (integers).
    BitXor,
    /// `a << b` (integers; 0 when `b` is outside `0..64`), wrapping in 64 bits.
    Shl,
    /// `a >> b` (integers, arithmetic; `b` outside `0..64` shifts by 63).
    Shr,
    /// The remainder with the dividend's sign (C `%`, `fmod`; 0 for an integer division by 0).
    TruncMod,
    /// The remainder with the divisor's sign (0 for an integer division by 0).
    FloorMod,
}

/// A reduction's combining operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum, starting at 0.
    Sum,
    /// Maximum, starting at -inf (or the smallest integer).
    Max,
    /// Minimum, starting at +inf (or the largest integer).
    Min,
    /// Product, starting at 1.
    Prod,
}

/// One node of the DAG. Every node has a [`Scalar`] type (see [`Graph::scalar`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// The kernel's coordinate on axis `n` (i64).
    Coord(u32),
    /// The reduction variable `id` of an enclosing [`Node::Reduce`] (i64).
    RVar(u32),
    /// An integer constant.
    Int(i64),
    /// A float constant (the bits of an `f64`) in the given float scalar.
    Float(u64, Scalar),
    /// A unary operation (float scalars, except `Neg`/`Abs` on integers).
    Un(Un, NodeId),
    /// A binary operation on two nodes of the same scalar.
    Bin(Bin, NodeId, NodeId),
    /// `cond != 0 ? a : b` (cond i64, `a` and `b` of one scalar).
    Select(NodeId, NodeId, NodeId),
    /// The value converted to the storage dtype (rounded like a store and a load would) and
    /// held in that dtype's compute scalar: `astype`.
    Convert(DType, NodeId),
    /// Input buffer `buf` at the given indices (one per buffer dim, in range).
    Load {
        /// Index into [`Kernel::inputs`].
        buf: u32,
        /// One i64 node per dim.
        index: Vec<NodeId>,
    },
    /// A reduction over `vars` (id, extent) of `body`.
    Reduce {
        /// How values combine.
        op: RedOp,
        /// The reduction variables with their extents.
        vars: Vec<(u32, u64)>,
        /// The reduced expression.
        body: NodeId,
    },
    /// Row statistic `n` of a row kernel.
    Stat(u32),
}

/// A hash-consed DAG of nodes: structurally equal nodes share one id.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    nodes: Vec<Node>,
    scalars: Vec<Scalar>,
    ids: HashMap<Node, NodeId>,
    next_rvar: u32,
    /// Scalar types of the input buffers (to type loads) and of stats.
    pub(crate) input_scalars: Vec<Scalar>,
    pub(crate) stat_scalars: Vec<Scalar>,
}

impl Graph {
    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// The scalar type of node `id`.
    pub fn scalar(&self, id: NodeId) -> Scalar {
        self.scalars[id as usize]
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A fresh reduction-variable id.
    pub fn fresh_rvar(&mut self) -> u32 {
        self.next_rvar += 1;
        self.next_rvar
    }

    /// Adds (or finds) a node. The scalar type follows from the operands.
    pub fn add(&mut self, n: Node) -> NodeId {
        if let Some(&id) = self.ids.get(&n) {
            return id;
        }
        let s = match &n {
            Node::Coord(_) | Node::RVar(_) | Node::Int(_) => Scalar::I64,
            Node::Float(_, s) => *s,
            Node::Un(_, a) => self.scalar(*a),
            Node::Bin(_, a, _) => self.scalar(*a),
            Node::Select(_, a, _) => self.scalar(*a),
            Node::Convert(d, _) => Scalar::of(*d),
            Node::Load { buf, .. } => self
                .input_scalars
                .get(*buf as usize)
                .copied()
                .unwrap_or(Scalar::F32),
            Node::Reduce { body, .. } => self.scalar(*body),
            Node::Stat(i) => self
                .stat_scalars
                .get(*i as usize)
                .copied()
                .unwrap_or(Scalar::F32),
        };
        let id = self.nodes.len() as NodeId;
        self.nodes.push(n.clone());
        self.scalars.push(s);
        self.ids.insert(n, id);
        id
    }

    /// An integer constant.
    pub fn int(&mut self, v: i64) -> NodeId {
        self.add(Node::Int(v))
    }

    /// A float constant in scalar `s` (an integer scalar gets the truncated value).
    pub fn float(&mut self, v: f64, s: Scalar) -> NodeId {
        match s {
            Scalar::I64 => self.int(v as i64),
            _ => self.add(Node::Float(v.to_bits(), s)),
        }
    }

    /// A binary node, folding integer constants and `x + 0`, `x * 1`, `x * 0` on integers.
    pub fn bin(&mut self, op: Bin, a: NodeId, b: NodeId) -> NodeId {
        if let (Node::Int(x), Node::Int(y)) = (self.node(a), self.node(b)) {
            let (x, y) = (*x, *y);
            let folded = match op {
                Bin::Add => Some(x.wrapping_add(y)),
                Bin::Sub => Some(x.wrapping_sub(y)),
                Bin::Mul => Some(x.wrapping_mul(y)),
                Bin::Div if y != 0 => Some(x / y),
                Bin::Rem if y != 0 => Some(x % y),
                Bin::Max => Some(x.max(y)),
                Bin::Min => Some(x.min(y)),
                Bin::Lt => Some(i64::from(x < y)),
                _ => None,
            };
            if let Some(v) = folded {
                return self.int(v);
            }
        }
        if self.scalar(a) == Scalar::I64 {
            let (ca, cb) = (self.int_value(a), self.int_value(b));
            match (op, ca, cb) {
                (Bin::Add, Some(0), _) | (Bin::Mul, Some(1), _) => return b,
                (Bin::Add | Bin::Sub, _, Some(0)) | (Bin::Mul | Bin::Div, _, Some(1)) => {
                    return a;
                }
                (Bin::Mul, Some(0), _) | (Bin::Mul, _, Some(0)) => return self.int(0),
                (Bin::Rem, _, Some(1)) => return self.int(0),
                _ => {}
            }
        }
        self.add(Node::Bin(op, a, b))
    }

    /// A unary node.
    pub fn un(&mut self, op: Un, a: NodeId) -> NodeId {
        self.add(Node::Un(op, a))
    }

    /// `cond ? a : b`.
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> NodeId {
        match self.int_value(cond) {
            Some(0) => b,
            Some(_) => a,
            None if a == b => a,
            None => self.add(Node::Select(cond, a, b)),
        }
    }

    /// The value of an integer constant node.
    pub fn int_value(&self, id: NodeId) -> Option<i64> {
        match self.node(id) {
            Node::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The value of a float constant node.
    pub fn float_value(&self, id: NodeId) -> Option<f64> {
        match self.node(id) {
            Node::Float(bits, _) => Some(f64::from_bits(*bits)),
            Node::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The direct operands of a node (for a reduce: its body).
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        match self.node(id) {
            Node::Coord(_) | Node::RVar(_) | Node::Int(_) | Node::Float(..) | Node::Stat(_) => {
                Vec::new()
            }
            Node::Un(_, a) | Node::Convert(_, a) => vec![*a],
            Node::Bin(_, a, b) => vec![*a, *b],
            Node::Select(c, a, b) => vec![*c, *a, *b],
            Node::Load { index, .. } => index.clone(),
            Node::Reduce { body, .. } => vec![*body],
        }
    }

    /// Rebuilds the DAG under `root`, mapping each node through `f` first: `f` returns
    /// `Some(replacement)` to replace a node (its operands are not visited), `None` to keep it
    /// and rebuild it from its rebuilt operands. Memoised per call.
    pub fn rewrite(
        &mut self,
        root: NodeId,
        f: &mut dyn FnMut(&mut Graph, NodeId) -> Option<NodeId>,
        memo: &mut HashMap<NodeId, NodeId>,
    ) -> NodeId {
        // Iterative post-order so deep chains cannot overflow the stack.
        let mut stack: Vec<(NodeId, bool)> = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if memo.contains_key(&id) {
                continue;
            }
            if !expanded {
                if let Some(r) = f(self, id) {
                    memo.insert(id, r);
                    continue;
                }
                stack.push((id, true));
                for o in self.operands(id) {
                    if !memo.contains_key(&o) {
                        stack.push((o, false));
                    }
                }
                continue;
            }
            let m = |x: &NodeId| memo.get(x).copied().unwrap_or(*x);
            let new = match self.node(id).clone() {
                Node::Un(op, a) => self.un(op, m(&a)),
                Node::Bin(op, a, b) => self.bin(op, m(&a), m(&b)),
                Node::Select(c, a, b) => self.select(m(&c), m(&a), m(&b)),
                Node::Convert(d, a) => self.add(Node::Convert(d, m(&a))),
                Node::Load { buf, index } => {
                    let index = index.iter().map(m).collect();
                    self.add(Node::Load { buf, index })
                }
                Node::Reduce { op, vars, body } => self.add(Node::Reduce {
                    op,
                    vars,
                    body: m(&body),
                }),
                n => self.add(n),
            };
            memo.insert(id, new);
        }
        memo.get(&root).copied().unwrap_or(root)
    }

    /// Replaces `Coord(i)` by `coords[i]` under `root`.
    pub fn substitute(&mut self, root: NodeId, coords: &[NodeId]) -> NodeId {
        let mut memo = HashMap::new();
        let mut f = |g: &mut Graph, id: NodeId| match g.node(id) {
            Node::Coord(i) => coords.get(*i as usize).copied(),
            _ => None,
        };
        self.rewrite(root, &mut f, &mut memo)
    }

    /// Every node reachable from `roots` (each once), operands before users.
    pub fn topo(&self, roots: &[NodeId]) -> Vec<NodeId> {
        let mut seen = vec![false; self.nodes.len()];
        let mut out = Vec::new();
        for &r in roots {
            let mut stack = vec![(r, false)];
            while let Some((id, done)) = stack.pop() {
                if done {
                    out.push(id);
                    continue;
                }
                if seen[id as usize] {
                    continue;
                }
                seen[id as usize] = true;
                stack.push((id, true));
                for o in self.operands(id).into_iter().rev() {
                    if !seen[o as usize] {
                        stack.push((o, false));
                    }
                }
            }
        }
        out
    }

    /// For each node under `roots`: the coordinates (bit per axis, axes < 64) and reduction
    /// variables it depends on, free ones only (a reduce binds its own variables).
    pub fn deps(&self, roots: &[NodeId]) -> HashMap<NodeId, Deps> {
        let mut out: HashMap<NodeId, Deps> = HashMap::new();
        for id in self.topo(roots) {
            let d = match self.node(id) {
                Node::Coord(i) => Deps {
                    coords: 1u64 << (*i).min(63),
                    rvars: Vec::new(),
                    stats: false,
                },
                Node::RVar(v) => Deps {
                    coords: 0,
                    rvars: vec![*v],
                    stats: false,
                },
                Node::Stat(_) => Deps {
                    coords: 0,
                    rvars: Vec::new(),
                    stats: true,
                },
                Node::Reduce { vars, body, .. } => {
                    let mut d = out.get(body).cloned().unwrap_or_default();
                    d.rvars.retain(|r| !vars.iter().any(|(v, _)| v == r));
                    d
                }
                _ => {
                    let mut d = Deps::default();
                    for o in self.operands(id) {
                        if let Some(x) = out.get(&o) {
                            d.coords |= x.coords;
                            d.stats |= x.stats;
                            for r in &x.rvars {
                                if !d.rvars.contains(r) {
                                    d.rvars.push(*r);
                                }
                            }
                        }
                    }
                    d
                }
            };
            out.insert(id, d);
        }
        out
    }
}

/// What a node depends on (see [`Graph::deps`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deps {
    /// Bit `i` set: depends on `Coord(i)`.
    pub coords: u64,
    /// Free reduction variables.
    pub rvars: Vec<u32>,
    /// Depends on a row statistic.
    pub stats: bool,
}

/// A kernel parameter buffer: contiguous, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The function parameter (inputs) or output name.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// Static extents.
    pub shape: Vec<u64>,
}

impl Buffer {
    /// The element count.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A row statistic: a reduction over the columns of the current row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// How values combine.
    pub op: RedOp,
    /// The value per element of the row (over all coordinates; earlier stats allowed).
    pub body: NodeId,
}

/// A write of one output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    /// Index into [`Kernel::outputs`].
    pub output: u32,
    /// Written once per row (at the row's linear index) instead of once per element.
    pub per_row: bool,
    /// The value.
    pub value: NodeId,
}

/// How the space maps to threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Grid-stride loop over elements, `vector` consecutive elements per thread step.
    Map {
        /// Threads per block.
        block: u32,
        /// Elements per thread step (1, 2, 4 or 8): 128-bit accesses when 16 bytes.
        vector: u32,
    },
    /// One warp per row, `rows_per_block` warps per block; each lane caches `per_thread`
    /// column values in registers.
    WarpPerRow {
        /// Warps (rows) per block.
        rows_per_block: u32,
        /// Columns each lane holds.
        per_thread: u32,
    },
    /// One block per row; each thread caches `per_thread` values (0: no cache, re-read).
    BlockPerRow {
        /// Threads per block.
        block: u32,
        /// Columns each thread holds (0 when the row is too wide to cache).
        per_thread: u32,
    },
}

/// One kernel (see the module doc).
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The CUDA symbol.
    pub name: String,
    /// Input buffers (the function's tensor parameters, in order).
    pub inputs: Vec<Buffer>,
    /// Output buffers.
    pub outputs: Vec<Buffer>,
    /// The coordinate space.
    pub space: Vec<u64>,
    /// How many leading coordinates index rows (`== space.len()`: a map kernel).
    pub row_axes: usize,
    /// Row statistics, in evaluation order.
    pub stats: Vec<Stat>,
    /// The writes.
    pub stores: Vec<Store>,
    /// The nodes.
    pub graph: Graph,
    /// The thread mapping.
    pub schedule: Schedule,
}

impl Kernel {
    /// The number of rows (product of the row extents).
    pub fn rows(&self) -> u64 {
        self.space[..self.row_axes].iter().product()
    }

    /// The number of columns per row (1 for a map kernel).
    pub fn cols(&self) -> u64 {
        self.space[self.row_axes..].iter().product()
    }

    /// Whether this is a row kernel.
    pub fn is_row(&self) -> bool {
        self.row_axes < self.space.len()
    }
}
