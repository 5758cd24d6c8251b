from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

import tenants.schema  # noqa: F401  (registers the API key's security scheme with drf-spectacular)
from config.health import healthz
from console.metrics_view import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("approvals/", include("approvals.urls")),
    path("console/", include("console.urls")),
    path("accounts/", include("console.accounts_urls")),
    path("api/v1/", include("agents.api_urls")),
    path("api/v1/", include("marketplace.api_urls")),
    path("api/v1/", include("tools.api_urls")),
    path("api/v1/", include("audit.api_urls")),
    path("api/v1/", include("approvals.api_urls")),
    path("api/v1/", include("releases.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file, so the page needs no inline script under the CSP.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="prometheus-django-metrics"),
]

# Under /api/ errors raised outside the API's views (no route matched, a refused request) are JSON too (core/api.py).
handler400 = "core.api.bad_request"
handler404 = "core.api.not_found"
handler500 = "core.api.server_error"
