"""What every request passes through: the body limit, hostile-input checks, error answers, HTTP metrics."""
