//! Schedules: how a kernel's coordinate space maps to CUDA threads.
//!
//! Contract: [`choose`] picks, from the kernel's shape alone (deterministic):
//!
//! - map kernels: 256 threads per block in a grid-stride loop; each thread step covers
//!   `vector` consecutive elements of the innermost axis so that the widest output moves
//!   16 bytes per access (4 × f32, 8 × f16/bf16), when the innermost extent is a multiple of
//!   it and the kernel has no per-element reduction (matmul, conv2d and pooling keep 1);
//! - row kernels with at most 1,024 columns: one warp per row, 4 rows per block, each lane
//!   holding `ceil(cols / 32)` columns in registers (softmax / layer_norm read memory once);
//! - wider rows: one block per row (256, 512 or 1,024 threads) holding up to 32 columns per
//!   thread in registers; rows wider than 32,768 columns are re-read instead of cached.
//!
//! ```text
//! softmax over [4096, 768] f16  -> WarpPerRow { rows_per_block: 4, per_thread: 24 }
//! add + relu over [64, 1024] f16 -> Map { block: 256, vector: 8 }
//! ```

use crate::kir::{Kernel, Node, Schedule};
use fusebox_core::ir::DType;

/// Bytes per element of a storage dtype.
pub fn dtype_bytes(d: DType) -> u32 {
    match d {
        DType::F64 | DType::I64 => 8,
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 => 2,
        _ => 1,
    }
}

/// The schedule for `k` (see the module doc).
pub fn choose(k: &Kernel) -> Schedule {
    if k.is_row() {
        let cols = k.cols();
        if cols <= 1024 {
            return Schedule::WarpPerRow {
                rows_per_block: 4,
                per_thread: cols.div_ceil(32).max(1) as u32,
            };
        }
        let block: u64 = if cols <= 8192 {
            256
        } else if cols <= 16384 {
            512
        } else {
            1024
        };
        let per = cols.div_ceil(block);
        return Schedule::BlockPerRow {
            block: block as u32,
            per_thread: if per <= 32 { per as u32 } else { 0 },
        };
    }
    let has_reduce = k
        .graph
        .topo(&k.stores.iter().map(|s| s.value).collect::<Vec<_>>())
        .iter()
        .any(|&n| matches!(k.graph.node(n), Node::Reduce { .. }));
    let widest = k
        .stores
        .iter()
        .filter_map(|s| k.outputs.get(s.output as usize))
        .map(|b| dtype_bytes(b.dtype))
        .max()
        .unwrap_or(4);
    let last = k.space.last().copied().unwrap_or(1);
    let mut vector = (16 / widest).max(1);
    if has_reduce {
        vector = 1;
    }
    while vector > 1 && last % u64::from(vector) != 0 {
        vector /= 2;
    }
    Schedule::Map { block: 256, vector }
}
