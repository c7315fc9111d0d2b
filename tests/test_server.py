"""The OpenAI-compatible server, driven over real HTTP by the official `openai` client.

One uvicorn server per module, on loopback, serving the embedded default model (it has a
tokenizer and a chat template). Apps with other settings (API key, rate limit, a dead engine)
share its AsyncLLM through in-process ASGI transports.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")


from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.openai.api_server import (  # noqa: E402
    ServerSettings,
    build_app,
    engine_args_from,
    make_arg_parser,
    unsupported_flags,
)
from tests.running_server import RunningServer, openai_http_library, wait_idle  # noqa: E402

httpx = openai_http_library(openai)

MAX_LEN = 512
BODY_LIMIT = 64 * 1024
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    llm = AsyncLLM.from_engine_args(EngineArgs(max_model_len=MAX_LEN, max_num_seqs=64))
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    app = build_app(engine, ServerSettings(served_model_names=["smol", "smol-alias"],
                                           max_body_bytes=BODY_LIMIT, shutdown_engine=False))
    srv = RunningServer(app)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(autouse=True)
def _settle(engine):
    # Runs before the conftest leak check: let aborted requests reach the engine thread.
    yield
    wait_idle(engine)


def test_models_health_version(client, server):
    names = [m.id for m in client.models.list().data]
    assert names == ["smol", "smol-alias"]
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/version").json()["version"]


def test_completion_stream_matches_whole(client, server):
    whole = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 12
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(
        model="smol-alias", prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # A list of prompts (text and token ids): one choice each, in order.
    ids = httpx.post(server.base_url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    many = client.completions.create(model="smol", prompt=[PROMPT, "Hello"], max_tokens=4,
                                     temperature=0)
    assert [c.index for c in many.choices] == [0, 1]
    by_ids = client.completions.create(model="smol", prompt=ids, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == whole.choices[0].text


def test_completion_echo_logprobs_stop_seed(client):
    echo = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0,
                                     echo=True)
    assert echo.choices[0].text.startswith(PROMPT)
    lp = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0,
                                   logprobs=2).choices[0].logprobs
    assert len(lp.tokens) == 3 and all(len(t) >= 2 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    full = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12,
                                     temperature=0).choices[0].text
    stop = full.strip()[:3]
    cut = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    sampled = [client.completions.create(model="smol", prompt=PROMPT, max_tokens=8,
                                         temperature=1.0, top_p=0.9, seed=7,
                                         extra_body={"top_k": 50, "min_p": 0.01}).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_chat_and_stream(client):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                           max_completion_tokens=10)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert whole.usage.completion_tokens <= 10
    chunks = list(client.chat.completions.create(
        model="smol", messages=messages, temperature=0, max_tokens=10, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]


def test_chat_logprobs_and_top_logprobs(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    resp = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                          max_tokens=5, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for pos in content:
        tops = [t.logprob for t in pos.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        # Greedy: the chosen token is the most likely one.
        assert pos.logprob == tops[0] and pos.token == pos.top_logprobs[0].token
    plain = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                           max_tokens=5)
    assert plain.choices[0].logprobs is None
    assert "".join(p.token for p in content) == plain.choices[0].message.content
    # Past max_logprobs (20): the error names the field the client sent, not the engine's.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=messages, max_tokens=1,
                                       logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"
    assert e.value.body["message"].startswith("top_logprobs=21 is larger than max_logprobs=20")


def test_n_samples_completions(client, server):
    # Greedy: every sample is the same text; usage counts all of them, the prompt once.
    one = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    three = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                      n=3, extra_body={"ignore_eos": True})
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.text for c in three.choices} == {one.choices[0].text}
    assert three.usage.completion_tokens == 18
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    # Two prompts x two samples: index = prompt index * n + sample index.
    many = client.completions.create(model="smol", prompt=[PROMPT, "Hello"], max_tokens=3,
                                     temperature=0, n=2, extra_body={"ignore_eos": True})
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == one.choices[0].text[:len(
        many.choices[0].text)]
    assert many.usage.completion_tokens == 12
    # Streaming, sampled with a seed: chunks of index 0 and 1 reassemble into the samples
    # the whole response holds (the same seed gives the same samples).
    kw = dict(model="smol", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11, n=2,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    finish = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 16


def test_n_samples_chat(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                           max_tokens=6, n=3)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.message.content for c in whole.choices}) == 1
    single = client.chat.completions.create(model="smol", messages=messages, temperature=0,
                                            max_tokens=6)
    assert whole.choices[0].message.content == single.choices[0].message.content
    assert whole.usage.completion_tokens == 3 * single.usage.completion_tokens
    assert whole.usage.prompt_tokens == single.usage.prompt_tokens
    chunks = list(client.chat.completions.create(
        model="smol", messages=messages, temperature=0, max_tokens=6, n=2, stream=True,
        stream_options={"include_usage": True}))
    texts, roles, finish = {}, {}, {}
    for c in chunks:
        for ch in c.choices:
            if ch.delta.role:
                roles[ch.index] = ch.delta.role
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {0: whole.choices[0].message.content, 1: whole.choices[0].message.content}
    assert set(finish) == {0, 1}
    assert chunks[-1].usage.completion_tokens == 2 * single.usage.completion_tokens


def test_64_concurrent_streams(server, engine):
    async def one(aclient, i: int) -> tuple[str, int]:
        stream = await aclient.completions.create(
            model="smol", prompt=f"Story number {i}:", max_tokens=8, temperature=0.8, seed=i,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                usage = chunk.usage
        return text, usage.completion_tokens

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x",
                                      max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, i) for i in range(64)))

    results = asyncio.run(main())
    assert len(results) == 64
    assert all(n == 8 for _, n in results)
    assert all(text for text, _ in results)


def test_disconnect_mid_stream_frees_blocks(server, engine, client):
    pool = engine.engine.scheduler.kv.pool
    body = {"model": "smol", "prompt": PROMPT, "max_tokens": 400, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            got = 0
            for line in lines:
                if line.startswith("data: "):
                    got += 1
                if got == 3:
                    break
            assert pool.num_free_blocks < pool.num_blocks  # the request holds blocks
        # Leaving the block closed the connection mid-stream.
    wait_idle(engine, timeout=10)
    assert pool.num_free_blocks == pool.num_blocks
    out = client.completions.create(model="smol", prompt=PROMPT, max_tokens=2)
    assert out.usage.completion_tokens == 2


def test_disconnect_while_waiting_for_whole_response(server, engine, client):
    body = {"model": "smol", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=0.5)
    wait_idle(engine, timeout=10)  # aborted long before its 400 tokens
    assert client.completions.create(model="smol", prompt=PROMPT,
                                     max_tokens=2).usage.completion_tokens == 2


def test_error_statuses(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=PROMPT, temperature=-1)
    err = e.value.body
    assert e.value.status_code == 400 and "temperature" in err["message"]
    assert err["type"] == "BadRequestError" and err["param"] == "temperature"
    assert err["code"] == 400
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=PROMPT, n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=[7] * 600, max_tokens=1)
    assert "600" in e.value.body["message"] and str(MAX_LEN) in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=[{"role": "user",
                                                                "content": "hi " * 700}])
    assert str(MAX_LEN) in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt=PROMPT)
    assert e.value.body["param"] == "model"
    r = httpx.post(server.base_url + "/v1/completions", json={"model": "smol"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    big = {"model": "smol", "prompt": "x" * (BODY_LIMIT + 1)}
    r = httpx.post(server.base_url + "/v1/completions", json=big)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    # Refused before it was read: the connection closes, the client cannot go on sending it.
    assert r.headers["connection"] == "close"


def test_api_key_and_rate_limit(engine):
    app = build_app(engine, ServerSettings(api_key="sekret", rate_limit=2,
                                           shutdown_engine=False))

    async def main():
        transport = httpx.ASGITransport(app=app)

        def make(key: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(base_url="http://asgi/v1", api_key=key, max_retries=0,
                                      http_client=httpx.AsyncClient(transport=transport))

        with pytest.raises(openai.AuthenticationError) as e:
            await make("wrong").models.list()
        assert e.value.status_code == 401
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as raw:
            r = await raw.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["code"] == 401
            assert (await raw.get("/health")).status_code == 200  # probes need no key
        good = make("sekret")
        out = await good.completions.create(model=engine.model_config.served_model_name,
                                            prompt=PROMPT, max_tokens=2)
        assert out.usage.completion_tokens == 2
        await good.models.list()
        with pytest.raises(openai.RateLimitError) as e:
            await good.models.list()
        retry = int(e.value.response.headers["retry-after"])
        assert 1 <= retry <= 60
        assert e.value.body["type"] == "RateLimitError"
        # The limit is per key: another (wrong) key is still refused by auth, not the limit.
        with pytest.raises(openai.AuthenticationError):
            await make("other").models.list()

    asyncio.run(main())


def test_dead_engine_503(engine):
    dead = AsyncLLM(engine.engine)  # never started: shares nothing running
    dead.mark_dead(RuntimeError("simulated device failure"))
    app = build_app(dead, ServerSettings(shutdown_engine=False))

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as raw:
            r = await raw.get("/health")
            assert r.status_code == 503 and "simulated" in r.json()["error"]["message"]
        aclient = openai.AsyncOpenAI(base_url="http://asgi/v1", api_key="x", max_retries=0,
                                     http_client=httpx.AsyncClient(transport=transport))
        with pytest.raises(openai.InternalServerError) as e:
            await aclient.completions.create(model=dead.model_config.served_model_name,
                                             prompt=PROMPT, max_tokens=2)
        assert e.value.status_code == 503

    asyncio.run(main())
    assert engine.errored is False


def _metrics(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base_url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move(client, server):
    before = _metrics(server.base_url)
    m = (("model_name", "smol"),)
    for name in ("octavo:num_requests_running", "octavo:num_requests_waiting",
                 "octavo:kv_cache_usage_perc"):
        assert (name, m) in before
    client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = _metrics(server.base_url)

    def delta(name: str, labels=m) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    n_prompt = len(httpx.post(server.base_url + "/tokenize",
                              json={"prompt": PROMPT}).json()["tokens"])
    assert delta("octavo:prompt_tokens_total") == n_prompt
    assert delta("octavo:generation_tokens_total") == 5
    assert delta("octavo:request_success_total",
                 (("finished_reason", "length"), ("model_name", "smol"))) == 1
    assert delta("octavo:e2e_request_latency_seconds_count") == 1
    assert delta("octavo:time_to_first_token_seconds_count") == 1
    assert delta("octavo:time_per_output_token_seconds_count") == 1
    assert delta("octavo:time_per_output_token_seconds_sum") > 0
    assert delta("octavo:request_queue_time_seconds_count") == 1
    assert ("octavo:num_preemptions_total", m) in after
    for mode in ("recompute", "swap"):
        assert ("octavo:num_preemptions_by_mode_total",
                (("mode", mode), ("model_name", "smol"))) in after
    assert delta("octavo:prefix_cache_queries_total") == n_prompt
    hits = delta("octavo:prefix_cache_hits_total")
    assert hits % 16 == 0 and hits < n_prompt
    if n_prompt > 16:  # the same prompt again: its full blocks come from the cache
        client.completions.create(model="smol", prompt=PROMPT, max_tokens=1, temperature=0)
        again = _metrics(server.base_url)
        assert again[("octavo:prefix_cache_hits_total", m)] > after.get(
            ("octavo:prefix_cache_hits_total", m), 0.0)
    assert after[("octavo:kv_cache_usage_perc", m)] == 0.0


def test_tokenize_detokenize(server):
    r = httpx.post(server.base_url + "/tokenize", json={"prompt": "hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == MAX_LEN
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "hello world"
    chat = httpx.post(server.base_url + "/tokenize",
                      json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > r["count"]
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400


def test_unbuilt_flags_are_rejected():
    from octavo.entrypoints import cli

    args = make_arg_parser().parse_args(
        ["--tensor-parallel-size", "2", "--quantization", "awq", "--enable-prefix-caching",
         "--swap-space", "1", "--preemption-mode", "swap"])
    # prefix caching, swap, quantization and tensor parallelism are built: none refused
    assert unsupported_flags(args) == []
    assert engine_args_from(args).tensor_parallel_size == 2
    bad = unsupported_flags(make_arg_parser().parse_args(["--tensor-parallel-size", "0"]))
    assert len(bad) == 1 and "--tensor-parallel-size must be >= 1" in bad[0]
    swap = engine_args_from(args)
    assert (swap.preemption_mode, swap.swap_space) == ("swap", 1.0)
    default = engine_args_from(make_arg_parser().parse_args([]))
    assert (default.preemption_mode, default.swap_space) == ("recompute", 4.0)
    assert (default.enforce_eager, default.async_scheduling) == (False, None)  # None: auto
    tuned = engine_args_from(make_arg_parser().parse_args(
        ["--enforce-eager", "--no-async-scheduling"]))
    assert (tuned.enforce_eager, tuned.async_scheduling) == (True, False)
    assert not tuned.create_engine_config().scheduler_config.async_scheduling
    with pytest.raises(SystemExit):  # argparse names the bad choice
        make_arg_parser().parse_args(["--preemption-mode", "discard"])
    assert cli.main(["serve", "some-model", "--tensor-parallel-size", "0"]) == 2
    ok = cli.build_parser().parse_args(
        ["serve", "m", "--served-model-name", "a", "b", "--api-key", "k", "--rate-limit", "5"])
    assert ok.model_tag == "m" and ok.served_model_name == ["a", "b"]
    assert unsupported_flags(ok) == []
    metrics_port = make_arg_parser().parse_args(["--metrics-port", "9100"])
    assert metrics_port.metrics_port == 9100
