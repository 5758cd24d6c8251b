from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from tenants import keycache
        from tenants.models import ApiKey, Membership, Tenant

        # Whatever decides an API key's access changed: every process's cached keys are void (tenants/keycache.py).
        for model in (ApiKey, Membership, Tenant, get_user_model()):
            post_save.connect(keycache.on_change, sender=model, dispatch_uid=f"keycache-save-{model.__name__}")
            post_delete.connect(keycache.on_change, sender=model, dispatch_uid=f"keycache-delete-{model.__name__}")
