"""``waferrt bench``'s refusals: one line naming what to write, exit 2, before a request is sent."""

import pytest

from waferrt.cli import main


@pytest.mark.parametrize("argv, says", [
    (["--request-rate", "0"], "--request-rate is requests per second"),
    (["--request-rate", "fast"], "--request-rate is requests per second"),
    (["--burstiness", "-1"], "positive number"),
    (["--range-ratio", "1"], "--range-ratio is in [0, 1)"),
    (["--slo", "ttft"], "ttft:500,tpot:50"),
    (["--slo", "p99:5"], "ttft:500,tpot:50"),
    (["--num-prompts", "0"], "--num-prompts 20"),
    (["--max-concurrency", "0"], "--max-concurrency 8"),
    (["--base-url", "ftp://127.0.0.1"], "--base-url is http://HOST:PORT"),
    (["--base-url", "http://127.0.0.1:9/v1?x=1"], "--base-url is http://HOST:PORT"),
    (["--base-url", "http://127.0.0.1:9"], "no OpenAI-compatible server answers"),  # nothing listens on port 9
])
def test_a_bad_bench_command_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("hello\n")
    try:
        code = main(["bench", "--prompts", str(tmp_path / "p.txt"), *argv])
    except SystemExit as e:  # argparse's refusal
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_only_an_address_written_on_the_command_line_may_leave_this_machine():
    from waferrt.cli.loadgen import check_base_url, is_loopback

    assert is_loopback("http://127.0.0.1:8000") and is_loopback("http://localhost:1") and is_loopback("http://[::1]:8")
    assert not is_loopback("http://10.0.0.1:8000") and not is_loopback("http://example.org")
    assert check_base_url("http://10.0.0.1:8000/", explicit=True) == "http://10.0.0.1:8000"
    with pytest.raises(ValueError, match="only with --base-url"):
        check_base_url("http://10.0.0.1:8000", explicit=False)


CHUNK = b'data: {"choices": [{"text": "hi", "index": 0}]}\n\n'


@pytest.mark.parametrize("answer, says", [
    (b"", "no response headers: the server never answered"),
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
     + b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK), "HTTP 200, 1 chunk(s) (1 with text), no [DONE] after"),
], ids=["silent", "one-chunk"])
def test_a_request_that_runs_out_of_time_says_how_far_its_answer_came(answer, says):
    """A server on loopback that stalls (before its headers, or after one chunk): the request fails within its
    timeout, naming where the answer stopped, with the text it had."""
    import asyncio

    import httpx

    from waferrt.cli.loadgen import Target, send

    async def stall(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:  # the run ended: the event loop closes
            pass
        writer.close()

    async def go():
        server = await asyncio.start_server(stall, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target(f"http://127.0.0.1:{port}", timeout_s=0.5)
        async with server, httpx.AsyncClient(base_url=target.base_url) as client:
            return await send(client, target, {"prompt": "x", "stream": True})

    sent = asyncio.run(go())
    assert not sent.outcome.success and sent.outcome.error.startswith("no answer within 0.5 s: " + says), sent
    assert sent.text == ("hi" if answer else "")
