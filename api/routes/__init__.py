"""One router per resource: traces, jobs, SQL, and the server's health and metrics."""
