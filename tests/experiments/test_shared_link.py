"""Several jobs on one simulated link: without a bound their controllers bid connections up; with
the receiver's share they stay within it, keep the link full and share it evenly."""
from automdt.experiments import shared_link


def test_jobs_on_one_link_keep_it_full_and_share_it_within_the_receivers_budget():
    cases = shared_link.shared_cases(2, jobs=(8,))
    assert shared_link.shared_cases(2, jobs=(8,))[1].describe() == cases[1].describe()  # held-out, reproducible
    rows = shared_link.run_all(cases, ("default",), reps=1)
    summary = {r["share"]: r for r in shared_link.summarize(rows)}
    bare, shared = summary[False], summary[True]
    # each controller tunes for its own transfer: together they ask for more than the budget ...
    assert bare["connections"] > shared_link.TOTAL_CONNECTIONS, bare
    # ... and within the share they stay in it, the link full, each job its part
    assert all(r["connections"] <= shared_link.TOTAL_CONNECTIONS for r in rows if r["share"]), rows
    assert shared["of_link_min"] >= 0.95 and shared["jain_min"] >= 0.95, shared
    md = shared_link.tables(shared_link.summarize(rows))
    assert "| 8 | default | yes |" in md and "| 8 | default | no |" in md


def test_one_jobs_share_of_the_link_follows_the_others_connections():
    base = shared_link.shared_cases(1, jobs=(2,))[0].profile
    tpt, link = base.net.tpt, base.net.bandwidth
    for n, others in ((1, 0), (4, 0), (64, 0), (1, 12), (4, 12), (12, 200)):
        carried = float(shared_link._net_with_others(base, n, others).capacities((1, n, 1))[1])
        # a full link is shared per connection; one the connections do not fill gives each its rate
        want = n * min(tpt, link / (n + others))
        assert abs(carried - want) <= 1e-9 * want, (n, others, carried, want)
    assert float(shared_link._net_with_others(base, 64, 0).capacities((1, 64, 1))[1]) == min(64 * tpt, link)
