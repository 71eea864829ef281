use lazarus::*;

#[test]
fn allreduce_with_kill() {
    let cfg = Config::new(4)
        .protocol(ProtocolKind::Coordinated)
        .checkpoint_every(2)
        .kill("1@50%".parse().unwrap());
    let report = lazarus::run(&cfg, |ctx| {
        let world = ctx.world();
        let mut state: (u64, f64) = ctx.restore_or_else(|| (0, 0.0))?;
        while state.0 < 20 {
            let s = world.all_reduce((world.rank() + 1) as f64 * state.0 as f64, ReduceOp::Sum)?;
            state = (state.0 + 1, state.1 + s);
            ctx.set_progress(state.0 as f64 / 20.0);
            ctx.checkpoint(&state)?;
        }
        Ok(state.1)
    });
    println!("{:?}", report.stats);
    assert_eq!(report.outcome.unwrap(), vec![1900.0; 4]);
}
