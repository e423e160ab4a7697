//! Prints the CUDA C++ of one instance: `emit_one [index | name-substring]`, an index into
//! `instances_for(sm_90a)` (every instance, the sm_90a wgmma ones last) or the first instance
//! whose kernel name contains the argument.
fn main() {
    let all = fusebox_cutlass::generator::instances_for(fusebox_cuda::Arch::Sm90a);
    let arg = std::env::args().nth(1).unwrap_or_default();
    let inst = match arg.parse::<usize>() {
        Ok(i) => all.get(i),
        Err(_) => all.iter().find(|i| i.kernel_name().contains(&arg)),
    };
    if let Some(inst) = inst {
        print!("{}", fusebox_cutlass::generator::emit(inst));
    }
}
