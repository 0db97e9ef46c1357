"""tests/conftest.py's order for xdist's worksteal: long tests dealt alternately to the front of each half, the
tests of one ``xdist_group`` kept in one half."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import long_tests_first_in_each_half


class _Def(SimpleNamespace):
    pass


def _item(name: str, isolated=False, slow=False, module_fixture=False, group=None):
    defs = {"tmp_path": [_Def(scope="function")]}
    if module_fixture:
        defs["env"] = [_Def(scope="module")]
    markers = {"isolated": object() if isolated else None,
               "xdist_group": SimpleNamespace(args=(group,), kwargs={}) if group else None}  # fmt: skip
    return SimpleNamespace(
        name=name,
        keywords={"slow": True} if slow else {},
        get_closest_marker=markers.get,
        _fixtureinfo=SimpleNamespace(name2fixturedefs=defs),
    )


def test_long_tests_lead_both_halves_and_module_fixture_users_stay():
    items = [_item(f"s{i}") for i in range(6)]
    items.insert(2, _item("slow_a", slow=True))
    items.insert(4, _item("iso_a", isolated=True, slow=True))
    items.append(_item("iso_b", isolated=True, slow=True))
    items.append(_item("slow_fixture", slow=True, module_fixture=True))  # shares a module fixture: not moved
    items.append(_item("slow_b", slow=True))
    order = [it.name for it in long_tests_first_in_each_half(items, run_slow=True)]
    assert sorted(order) == sorted(it.name for it in items)  # a permutation
    half = len(items) // 2
    first, second = order[:half], order[half:]
    assert first[:2] == ["iso_a", "slow_a"] and second[:2] == ["iso_b", "slow_b"]
    assert order.index("slow_fixture") > order.index("s5")  # kept among the short tests, in collection order
    # without --runslow the slow tests are skipped, so nothing here counts as long: the collection order stays
    assert long_tests_first_in_each_half(items, run_slow=False) == items


def test_a_group_stays_in_one_half_behind_the_long_tests():
    """Two slow tests that share a compile cache (group "w") must not lead both halves, where both workers would
    compile the same kernels at once; the group's short tests follow its long ones; an isolated job in a group is
    dealt like any long test (it shares nothing)."""
    items = [_item(f"s{i}") for i in range(8)]
    items.insert(1, _item("w_slow_a", slow=True, group="w"))
    items.insert(3, _item("w_short_a", group="w"))
    items.insert(5, _item("w_fixture", slow=True, module_fixture=True, group="w"))  # weight 0: a short member
    items.append(_item("w_slow_b", slow=True, group="w"))
    items.append(_item("slow_c", slow=True))
    items.append(_item("slow_d", slow=True))
    items.append(_item("iso_a", isolated=True, slow=True))
    items.append(_item("iso_b", isolated=True, slow=True, group="w"))
    items.append(_item("m_short", group="m"))
    order = [it.name for it in long_tests_first_in_each_half(items, run_slow=True)]
    assert sorted(order) == sorted(it.name for it in items)
    half = len(items) // 2
    first, second = order[:half], order[half:]
    # the ungrouped long tests go to the half with fewer long ones so far: both of them to the second here
    assert first[:5] == ["iso_a", "w_slow_a", "w_slow_b", "w_short_a", "w_fixture"]
    assert second[:4] == ["iso_b", "slow_c", "slow_d", "m_short"]  # the second group's home is the other half
    assert all(f"s{i}" in order for i in range(8)) and order.index("s0") > order.index("w_fixture")
