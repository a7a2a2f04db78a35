"""Server-rendered review pages (Jinja2, no build step)."""
