"""``/accounts/``: Django's auth views, with the console's login and logout (CSP, redirects) first."""

from __future__ import annotations

from django.urls import include, path

from console import views

urlpatterns = [
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("", include("django.contrib.auth.urls")),
]
