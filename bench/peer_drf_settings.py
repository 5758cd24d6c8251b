"""Settings of ``bench/peer_drf.py``: the console's settings (same database, same models), with DRF and Django as they
ship: Django's default middleware, DRF's JSON renderer (token authentication and cursor pagination are set on the viewset)."""

from config.settings import *  # noqa: F403 - the same database, apps and models as the console under test

INSTALLED_APPS = [*INSTALLED_APPS, "rest_framework.authtoken"]  # noqa: F405
ROOT_URLCONF = "peer_drf"
MIDDLEWARE = [  # django-admin startproject's list
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
REST_FRAMEWORK = {
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}
