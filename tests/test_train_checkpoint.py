"""Which checkpoints keep what (agentrl/train/checkpoint.py: retention_plan, pure); the loop's use of it
is in test_train_loop.py."""


from agentrl.train.checkpoint import retention_plan


def test_retention_keeps_the_newest_full_states_and_exports_until_evaluated():
    ckpts = {1: (True, True), 2: (False, True), 3: (True, True), 4: (False, True), 5: (True, True), 6: (False, False)}
    plan = retention_plan(ckpts, keep_last=2, keep_exports="until_evaluated", evaluated={1, 2, 4},
                          published=4, latest=5)
    assert plan.drop_state == (1,)                 # 3 and 5 are the newest two full ones
    assert plan.drop_export == (1, 2)              # 4 is evaluated but published: the servers may load it
    assert retention_plan(ckpts, keep_last=1, keep_exports="all", evaluated={1, 2}, published=None,
                          latest=3).drop_state == (1,)      # `latest` keeps its state whatever keep_last says
    assert retention_plan(ckpts, keep_last=1, keep_exports="all", evaluated={1, 2}, published=None,
                          latest=5).drop_export == ()
