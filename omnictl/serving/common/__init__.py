"""What every endpoint shares: one request's intake and tracking, auth, metrics, errors, bodies, limits."""
