"""A rejected reload logs every problem of the file, one entry each (not only the first)."""

from __future__ import annotations

from structlog.testing import capture_logs

from tests.ops.test_reload import config_data, served, write

__all__ = ["served"]  # the fixture, used by name


def test_a_rejected_reload_lists_every_problem(served, fake, tmp_path):
    proxy, path, reloader = served
    old = proxy.runtime.config
    data = config_data(fake[1].url, tmp_path, server={"port": 99999})
    data["policies"]["last1"]["max_turns"] = "1"
    write(path, data)
    with capture_logs() as logs:
        assert proxy.loop.run(reloader.reload()) is False
    assert proxy.runtime.config is old
    [line] = [entry for entry in logs if entry["event"] == "config_reload_rejected"]
    assert line["problems"] == [
        "policies.last1.max_turns: must be an integer, got '1'",
        "server.port: must be <= 65535, got 99999",
    ]
