"""Model servers: a CPU stand-in for SGLang's HTTP API (cpu_server) and the /generate logic it runs (generation)."""
