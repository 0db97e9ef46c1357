"""tests/conftest.py's order for xdist's worksteal: long tests dealt alternately to the front of each half."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import long_tests_first_in_each_half


class _Def(SimpleNamespace):
    pass


def _item(name: str, isolated=False, slow=False, module_fixture=False):
    defs = {"tmp_path": [_Def(scope="function")]}
    if module_fixture:
        defs["env"] = [_Def(scope="module")]
    return SimpleNamespace(
        name=name,
        keywords={"slow": True} if slow else {},
        get_closest_marker=lambda m: object() if (m == "isolated" and isolated) else None,
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
