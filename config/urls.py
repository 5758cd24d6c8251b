from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.health import healthz
from config.metrics_view import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("approvals/", include("tools.urls")),
    path("console/", include("console.urls")),
    path("accounts/", include("console.accounts_urls")),
    path("api/v1/", include("agents.api_urls")),
    path("api/v1/", include("marketplace.api_urls")),
    path("api/v1/", include("tools.api_urls")),
    path("api/v1/", include("audit.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="prometheus-django-metrics"),
]
