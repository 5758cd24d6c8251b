"""API clients for tests: one signed in with an API key, as a client app would be."""

from __future__ import annotations

from rest_framework.test import APIClient


def bearer_client(raw_key: str) -> APIClient:
    """A DRF test client that sends ``Authorization: Bearer <raw_key>`` with every request."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client
