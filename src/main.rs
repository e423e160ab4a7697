//! The `fusebox` command line.

fn main() {
    println!("fusebox");
}
