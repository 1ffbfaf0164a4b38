"""The HTTP service: FastAPI app, routes, API schemas, dashboard pages and the job runner."""
