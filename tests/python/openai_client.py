"""Drives `dstwin serve` with the official openai client: completions and chat completions,
streaming and not. Usage: openai_client.py BASE_URL (e.g. http://127.0.0.1:8000/v1)."""

import sys

from openai import OpenAI


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="unused")
    model = client.models.list().data[0].id

    c = client.completions.create(model=model, prompt="hello", max_tokens=6, seed=3)
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.completion_tokens == 6, c.usage
    assert len(c.choices[0].text.split(" ")) == 6, c.choices[0].text

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

    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content.split(" ")) == 5

    parts = []
    for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert len("".join(parts).split(" ")) == 5, parts

    try:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
        raise AssertionError("an unknown model must fail")
    except Exception as e:  # openai.NotFoundError
        assert "404" in str(e) or "does not exist" in str(e), e

    print("ok")


if __name__ == "__main__":
    main()
