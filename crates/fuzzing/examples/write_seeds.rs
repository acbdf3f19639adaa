//! Writes the seeds of every target into `fuzz/corpus/<target>/`
//! (`cargo run -p fuzzing --example write_seeds`; decision 0027).

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (target, _) in fuzzing::TARGETS {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in fuzzing::seeds::seeds(target) {
            std::fs::write(dir.join(&name), &bytes)?;
            println!("{target}/{name}: {} bytes", bytes.len());
        }
    }
    Ok(())
}
