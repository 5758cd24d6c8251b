"""Managing tenants, members and API keys (the services and their admin), with their audit rows.

Above ``audit`` (every change is recorded), while ``tenants`` (the models and THE tenancy gate) sits below it.
"""
