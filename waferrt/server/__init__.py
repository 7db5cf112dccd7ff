"""The wafer behind an OpenAI-compatible HTTP server (``waferrt serve``): a join floor over the LLM and the CLI.

``runner`` keeps the decode running in a thread of the driver and feeds it requests; ``protocol`` checks
the request bodies; ``generation`` turns one request's tokens into answers (whole or streamed);
``metrics`` the Prometheus page; ``state`` the live page's data; ``app`` the Starlette routes; ``command``
the subcommand. Sockets and the web stack live here only, never in the pure floors.
"""
