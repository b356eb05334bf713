"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of the live coordinator."""
