from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "releases"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Release safety"

    def ready(self) -> None:
        from agents.erasure import register_eraser
        from releases.erasure import erase_results

        register_eraser("replay_results", erase_results)  # a session's erasure covers replay results of its runs
