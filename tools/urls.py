from django.urls import path

from tools import approval_views

app_name = "approvals"

urlpatterns = [
    path("", approval_views.inbox, name="inbox"),
    path("<uuid:pk>/", approval_views.detail, name="detail"),
    path("<uuid:pk>/decide", approval_views.decide, name="decide"),
]
