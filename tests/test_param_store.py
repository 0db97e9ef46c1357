"""ParamStore: weights AND buffers travel with their version; readers never load a torn or stale copy."""

import torch

from sample_fast.param_store import NOT_PUBLISHED, ParamStore


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("obs_mean", torch.zeros(3))


def _set(net: Net, value: float) -> None:
    with torch.no_grad():
        net.lin.weight.fill_(value)
        net.lin.bias.fill_(-value)
        net.obs_mean.fill_(10 * value)


def test_publish_and_load_carry_parameters_and_buffers():
    learner, actor = Net(), Net()
    store = ParamStore(learner)
    assert store.version == NOT_PUBLISHED
    assert store.load_if_newer(actor, -1) == -1  # nothing published yet: untouched
    _set(learner, 1.5)
    assert store.publish(learner) == 0
    assert store.load_if_newer(actor, -1) == 0
    assert torch.equal(actor.lin.weight, torch.full((2, 3), 1.5))
    assert torch.equal(actor.obs_mean, torch.full((3,), 15.0))  # normaliser statistics are buffers: they travel
    _set(learner, 2.0)
    assert store.publish(learner, version=7) == 7  # the runner passes learner.policy_version
    _set(actor, 0.0)
    assert store.load_if_newer(actor, 7) == 7  # not newer than what the actor has: no copy
    assert torch.equal(actor.lin.weight, torch.zeros(2, 3))
    assert store.load_if_newer(actor, 0) == 7
    assert torch.equal(actor.lin.bias, torch.full((2,), -2.0))


def test_reader_skips_publish_in_progress_and_torn_copies():
    learner, actor = Net(), Net()
    store = ParamStore(learner)
    _set(learner, 1.0)
    store.publish(learner)
    _set(actor, 0.0)
    # Simulate a writer that died or is mid-publish: odd sequence number, half-written weights, version bumped.
    store.meta[0] += 1
    store.tensors["lin.weight"].fill_(99.0)
    store.meta[1] = 5
    assert store.load_if_newer(actor, 0) == 0
    assert torch.equal(actor.lin.weight, torch.zeros(2, 3))  # untouched: no torn read
    store.meta[0] += 1  # publish completes
    assert store.load_if_newer(actor, 0) == 5
    assert torch.equal(actor.lin.weight, torch.full((2, 3), 99.0))


def test_copy_overlapping_a_publish_is_retried_then_given_up():
    learner, actor = Net(), Net()
    store = ParamStore(learner)
    _set(learner, 1.0)
    store.publish(learner)
    calls = {"n": 0}
    original = store.tensors
    store._staging_tensors()  # allocate the reader's staging area now, so only copies iterate below

    class Racing(dict):
        def items(self):
            calls["n"] += 1
            store.meta[0] += 2  # a whole publish happened during this copy
            return super().items()

    store.tensors = Racing(original)
    _set(actor, 0.0)
    assert store.load_if_newer(actor, -1, max_tries=3) == -1
    assert calls["n"] == 3 and torch.equal(actor.lin.weight, torch.zeros(2, 3))
    store.tensors = original
    assert store.load_if_newer(actor, -1) == 0


def test_mismatched_module_is_refused():
    store = ParamStore(Net())
    try:
        store.publish(torch.nn.Linear(3, 2))
    except ValueError as e:
        assert "obs_mean" in str(e)
    else:
        raise AssertionError("publishing another architecture must raise")
