"""Drives `dstwin serve` with the official openai client: completions and chat completions,
streaming and not, tools and reasoning through the server's parsers; then checks that the
server's /metrics agree with what the client saw (tokens, requests, latency counts).
Usage: openai_client.py BASE_URL (e.g. http://127.0.0.1:8000/v1). The server must be fresh
(nothing else sent to it) and run with --tool-call-parser deepseek_v31
--enable-auto-tool-choice --reasoning-parser deepseek_v3."""

import sys
import urllib.request

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def metrics(base_url: str) -> dict:
    """Sums of each /metrics series over its labels, keyed by name plus finished_reason."""
    root = base_url.rstrip("/").removesuffix("/v1")
    text = urllib.request.urlopen(f"{root}/metrics").read().decode()
    out: dict = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        if 'finished_reason="' in series:
            name += ":" + series.split('finished_reason="', 1)[1].split('"', 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def main() -> None:
    base_url = sys.argv[1]
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    seen = {"prompt": 0, "completion": 0, "requests": 0}

    def count(usage) -> None:
        seen["prompt"] += usage.prompt_tokens
        seen["completion"] += usage.completion_tokens
        seen["requests"] += 1

    c = client.completions.create(model=model, prompt="hello", max_tokens=6, seed=3)
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.completion_tokens == 6, c.usage
    assert len(c.choices[0].text.split(" ")) == 6, c.choices[0].text
    count(c.usage)

    text = ""
    usage = None
    for chunk in client.completions.create(
        model=model,
        prompt="hello",
        max_tokens=6,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage:
            usage = chunk.usage
    assert text == c.choices[0].text, (text, c.choices[0].text)
    assert usage is not None and usage.completion_tokens == 6, usage
    count(usage)

    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content.split(" ")) == 5
    count(r.usage)

    parts = []
    usage = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        assert chunk.usage is not None, chunk
        usage = chunk.usage
    assert len("".join(parts).split(" ")) == 5, parts
    count(usage)

    # Tools through the tool-call parser: the twin's text holds no call, so it is content.
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "weather in Hangzhou?"}],
        tools=TOOLS,
        max_tokens=4,
    )
    assert r.choices[0].finish_reason == "length", r
    assert not r.choices[0].message.tool_calls, r
    count(r.usage)

    # Reasoning (deepseek_v3 parser, thinking on): no </think> in the output, all reasoning.
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "think first"}],
        max_tokens=4,
        extra_body={"chat_template_kwargs": {"thinking": True}},
    )
    reasoning = (r.choices[0].message.model_extra or {}).get("reasoning")
    assert reasoning and len(reasoning.split(" ")) == 4, r
    assert r.choices[0].message.content is None, r
    count(r.usage)

    for bad in [
        dict(model="nope", prompt="x", max_tokens=1),
        dict(model=model, prompt="x", max_tokens=1, logprobs=2),
        dict(model=model, prompt="   ", max_tokens=1),
    ]:
        try:
            client.completions.create(**bad)
            raise AssertionError(f"must fail: {bad}")
        except Exception as e:  # openai.NotFoundError / BadRequestError
            assert getattr(e, "status_code", None) in (400, 404), e

    # The server's books agree with the client's.
    m = metrics(base_url)
    assert m["vllm:prompt_tokens_total"] == seen["prompt"], (m, seen)
    assert m["vllm:generation_tokens_total"] == seen["completion"], (m, seen)
    assert m["vllm:request_success_total:length"] == seen["requests"], (m, seen)
    assert m["vllm:request_success_total:abort"] == 0, m
    assert m["vllm:e2e_request_latency_seconds_count"] == seen["requests"], m
    assert m["vllm:time_to_first_token_seconds_count"] == seen["requests"], m
    assert m["vllm:request_generation_tokens_sum"] == seen["completion"], m

    print("ok")


if __name__ == "__main__":
    main()
