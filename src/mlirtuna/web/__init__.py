"""`mlirtuna serve`: a read-only web dashboard over the farm's database (docs/dashboard.md)."""
