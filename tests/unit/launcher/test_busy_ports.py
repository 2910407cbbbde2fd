"""Ports found in use on a node are skipped (issue 31): the shell reports them
(PortsBusy) and the core gives the held tasks other ports, pure table tests."""

from __future__ import annotations

from libs.common.exitspecs import PORTS_EXHAUSTED_EXIT_CODE
from libs.common.messages import JobState
from services.launcher.core import PortsBusy, StartTask
from services.launcher.core.ports import BUSY_PORT_SECONDS, PortBook
from tests.unit.launcher.builders import JOB, Driver, job_spec, role
from tests.unit.launcher.test_env_and_ports import place_two_nodes, two_roles_three_instances


def starts(actions) -> dict[tuple[str, int], StartTask]:
    return {(a.launch.key.role, a.launch.key.index): a for a in actions if isinstance(a, StartTask)}


def busy(driver: Driver, held: list[StartTask], ports: dict[str, list[int]]):
    return driver.handle(PortsBusy(job=JOB, attempt=1, tasks=[s.launch.key for s in held], busy=ports))


def test_a_port_found_in_use_is_replaced_and_every_held_task_starts_with_its_peers_new_ports() -> None:
    driver = two_roles_three_instances()
    held = place_two_nodes(driver)
    before = starts(held)
    assert before[("ps", 0)].launch.ports == {"ssh": [20000], "http": [20001]}

    actions = busy(driver, held, {"n1": [20000]})  # someone listens on 20000 of n1

    again = starts(actions)
    assert set(again) == {("ps", 0), ("worker", 0), ("worker", 1)}
    ps = again[("ps", 0)].launch
    new_ssh, new_http = ps.ports["ssh"][0], ps.ports["http"][0]
    # Neither the busy port nor one of worker 0's on the same node (nor its old ones, held till now).
    assert {new_ssh, new_http}.isdisjoint({20000, 20001, 20002, 20003}) and new_ssh != new_http
    assert again[("worker", 0)].launch.ports == before[("worker", 0)].launch.ports
    # Every task sees the new port of its peer; the record keeps it.
    assert all(s.launch.env["PAI_PORT_LIST_ps_0_ssh"] == str(new_ssh) for s in again.values())
    assert driver.record.current.task("ps", 0).ports["ssh"] == [new_ssh]


def test_applied_twice_it_replaces_nothing_more() -> None:
    driver = two_roles_three_instances()
    held = place_two_nodes(driver)
    first = starts(busy(driver, held, {"n1": [20000]}))
    second = starts(busy(driver, held, {"n1": [20000]}))
    assert {k: s.launch.ports for k, s in second.items()} == {k: s.launch.ports for k, s in first.items()}


def test_a_busy_port_is_skipped_for_the_next_tasks_until_it_has_been_skipped_long_enough() -> None:
    book = PortBook((20000, 20010))
    book.mark_busy("n1", [20000, 20002], until=100.0 + BUSY_PORT_SECONDS)
    assert book.allocate("n1", {"http": 2}, now=100.0) == {"http": [20001, 20003]}
    assert book.allocate("n2", {"http": 1}, now=100.0) == {"http": [20000]}  # another node
    assert book.allocate("n1", {"http": 1}, now=100.0 + BUSY_PORT_SECONDS) == {"http": [20000]}


def test_with_every_port_of_the_range_in_use_the_attempt_fails_as_ports_exhausted() -> None:
    driver = Driver(job_spec(role("worker", 1, ports={"http": 1})), port_range=(20000, 20002))
    driver.submit()
    held = list(starts(driver.place()).values())
    busy(driver, held, {"node-0": [20000, 20001]})
    assert driver.state == JobState.FAILED
    assert driver.record.current.exitCode == PORTS_EXHAUSTED_EXIT_CODE
