"""Cost of a call from the price table (prices per 1M input / output tokens)."""

from __future__ import annotations

from collections.abc import Iterable

from llm.config import ModelInfo, ProviderConfig
from runtime.types import Usage


class PriceTable:
    """``"provider/model"`` -> :class:`ModelInfo`; an unknown model costs 0 (and says so in the trace)."""

    def __init__(self, providers: Iterable[ProviderConfig] = ()) -> None:
        self._prices: dict[str, ModelInfo] = {}
        for provider in providers:
            for model, info in provider.models.items():
                self._prices[f"{provider.name}/{model}"] = info

    def known(self, model: str) -> bool:
        return model in self._prices

    def info(self, model: str) -> ModelInfo | None:
        return self._prices.get(model)

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        info = self._prices.get(model)
        if info is None:
            return 0.0
        return round(input_tokens * info.price_in_per_1m / 1_000_000 + output_tokens * info.price_out_per_1m / 1_000_000, 10)

    def priced(self, model: str, usage: Usage) -> Usage:
        return Usage(usage.input_tokens, usage.output_tokens, self.cost(model, usage.input_tokens, usage.output_tokens))
