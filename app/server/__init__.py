"""A local OpenAI-compatible HTTP server in front of the engine process (no Qt here).

gateway.py   the engine as the server sees it: submit / cancel from any thread, messages delivered
             to a callback (ProcessGateway owns an EngineProcess; the GUI has its own gateway).
schema.py    OpenAI request bodies -> CompletionRequest, results -> OpenAI responses and chunks.
api.py       the Starlette app: routes, key check, queue limit, streaming, disconnect -> cancel.
deadline.py  the write deadline: a client that takes no byte of its answer for 30 s loses its connection.
runner.py    where it may listen (loopback unless a key is set) and uvicorn in a thread or in front.
"""
