"""`kvadmit serve`: an OpenAI-compatible HTTP server over the engine loop, with SGLang's endpoints, log
lines and Prometheus metrics."""
