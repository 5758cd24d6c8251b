"""PostgreSQL, as Django's own backend with one change (``base.py``): psycopg's compiled timestamptz loader."""
