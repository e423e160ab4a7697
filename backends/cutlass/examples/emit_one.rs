//! Prints the CUDA C++ of one instance (`emit_one [index]`, an index into `all_instances()`).
fn main() {
    let all = fusebox_cutlass::generator::all_instances();
    let i: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if let Some(inst) = all.get(i) {
        print!("{}", fusebox_cutlass::generator::emit(inst));
    }
}
