"""Drives `dstwin serve --device cpu` with the official openai client: completions and chat
completions, streaming and not. Greedy output must be the same whole and streamed, seeded
sampling must repeat, and every answer carries real text.
Usage: openai_cpu.py BASE_URL (e.g. http://127.0.0.1:8000/v1)."""

import sys

from openai import OpenAI


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="unused")
    model = client.models.list().data[0].id
    prompt = "the twin predicts"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0)
    text = whole.choices[0].text
    assert whole.usage.completion_tokens >= 1, whole
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == text, (streamed, text)
    seeded = [
        client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=1.0, seed=11,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1] and seeded[0], seeded
    messages = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].message.content
    assert chat.usage.completion_tokens == 6, chat
    chunks = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == content, (streamed, content)
    print("ok")


if __name__ == "__main__":
    main()
