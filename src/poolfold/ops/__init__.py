"""The ops: each validates its inputs against its version's row, plans, then runs a kernel."""
