"""Test fixtures made for real: distributions, HTTP upstreams, client runs."""
