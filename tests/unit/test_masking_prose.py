"""Masking tells a secret from prose: field names are masked where they label a value, never in a sentence.

Run input, events, frames and audit all go through :func:`audit.masking.mask_text`; the demo agents read
order ids, amounts and flight numbers from the same text, so those must come through untouched.
"""

from __future__ import annotations

import pytest

from audit.masking import MASK, OPTIONAL_PATTERNS, mask_text, mask_value
from runtime.config import RAW_INPUT_PATTERNS, check_policy, raw_input_patterns

#: Ordinary sentences (English and Chinese) and the demo walkthroughs' inputs: left exactly as written.
PROSE = [
    "my token expired yesterday",
    "the password reset email never came",
    "I lost my secret key card",
    "a basic question about billing",
    "Basic questions first, please",
    "Token refresh failed after the update",
    "Digest emails arrive every Monday",
    "Bearer bonds are an old kind of security",
    "The Authorization header is missing from my request",
    "my password is wrong",
    "the password is too short",
    "the secret ingredient is love",
    "How do I rotate an API key?",
    "Please reset my password, I forgot it",
    "the session id is shown in the console",
    "max_tokens is 1024 and the tokens were used up",
    "the token count is 42",
    "Which signature do I need on the refund form?",
    "我的密码忘了，怎么重置？",
    "密码重置邮件一直没收到",
    "令牌过期了怎么办",
    "我的token昨天过期了",
    "密码是什么？",
    "请问 API key 在哪里设置",
    "验证码一直收不到",
    # the demo walkthroughs: the deterministic planner reads these values from the input
    "where is order O202411280001?",
    "What is the status of order O202411280001?",
    "refund 30.00 for order O202411280001 because the glass cup broke",
    "refund 1299.00 for order O202411280003",
    "订单O202411280001到哪了",
    "查询订单O202411280001的状态",
    "帮我退款订单 O202411280001",
    "订单 O202411280001 和 O202411280002 一共多少钱",
    "帮我把预订 XK9Q21 改签到 CA1234",
    "11月29日 上海到广州的航班",
    "flight CA1234 on 2024-11-29 from Beijing to Shanghai",
    "Forecast for a city. Keywords: 下雨, umbrella",
    "明天Shanghai要带伞吗",
]

#: (text, the raw secret that must not survive)
SECRETS = [
    ('{"password": "hunter2secret"}', "hunter2secret"),
    ("password=hunter2secret", "hunter2secret"),
    ("password: hunter2secret", "hunter2secret"),
    ("Password : hunter2secret", "hunter2secret"),
    ("my password is hunter2", "hunter2"),
    ("the password was Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("Authorization: Bearer abc", "abc"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ('{"Authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
    ("curl -H 'Authorization: Token abcdef'", "abcdef"),
    ("proxy-authorization=opaquevalue", "opaquevalue"),
    ("Bearer dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ("token 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("api_key=abcd1234efgh", "abcd1234efgh"),
    ("X-Api-Key: qwerty12345", "qwerty12345"),
    ("my api key is qwerty12345", "qwerty12345"),
    ("token = abc123", "abc123"),
    ("access_token: ya29.a0AfH6SMB", "ya29.a0AfH6SMB"),
    ("client_secret=s3cr3tvalue", "s3cr3tvalue"),
    ("https://example.com/cb?code=1&secret=topsecretvalue", "topsecretvalue"),
    ("use sk-proj-abcdefghijklmnop1234 for the call", "abcdefghijklmnop"),
    ("密码：hunter2", "hunter2"),
    ("密码: hunter2", "hunter2"),
    ("我的密码是 hunter2", "hunter2"),
    ("我的密码是hunter2，别告诉别人", "hunter2"),
    ("支付密码为123456", "123456"),
    ("验证码: 884422", "884422"),
    ("my card is 4111 1111 1111 1111", "4111 1111 1111"),
    ("卡号 4111111111111111 有效期 12/27", "411111111111"),
    ("cvv: 737", "737"),
]


@pytest.mark.parametrize("text", PROSE)
def test_prose_and_demo_inputs_are_left_alone(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_labelled_secrets_are_masked(text: str, secret: str) -> None:
    masked = mask_text(text)
    assert secret not in masked
    assert "*" in masked
    assert mask_text(masked) == masked  # idempotent: masking twice (input, then events) changes nothing


def test_the_reported_input_keeps_its_shape_and_loses_the_card_and_password() -> None:
    text = "my card is 4111 1111 1111 1111 and password: hunter2secret"
    assert mask_text(text) == f"my card is **** **** **** 1111 and password: {MASK}"


def test_a_version_may_keep_named_personal_data_raw_but_never_cards_or_secrets() -> None:
    text = "call 13812345678 or mail li.lei@example.com, id 110101199003071234, card 4111111111111111, password: hunter2secret"
    masked = mask_text(text, keep=["phone", "email"])
    assert "13812345678" in masked and "li.lei@example.com" in masked
    assert "110101199003071234" not in masked and "4111111111111111" not in masked and "hunter2secret" not in masked
    assert mask_value({"note": text}, keep=["id_number"])["note"].count("110101199003071234") == 1
    with pytest.raises(ValueError, match="always masked"):
        mask_text(text, keep=["card"])


def test_the_policy_names_the_same_optional_patterns_and_refuses_cards_and_passwords() -> None:
    assert set(RAW_INPUT_PATTERNS) == OPTIONAL_PATTERNS
    assert check_policy({"input_masking": {"raw": ["phone", "email"]}}) == []
    assert raw_input_patterns({"input_masking": {"raw": ["phone"]}}) == ("phone",)
    assert raw_input_patterns({}) == ()
    for bad in (["card"], ["password"], "phone", [{"phone": True}]):
        errors = check_policy({"input_masking": {"raw": bad}})
        assert len(errors) == 1 and errors[0].startswith("input_masking.raw: must be a list of names from"), errors
    assert check_policy({"input_masking": {"keep": ["phone"]}})[0].startswith("input_masking.keep: unknown field")


def test_an_ids_digits_are_not_masked_as_a_card_or_a_phone_and_what_is_beside_it_still_is() -> None:
    """A UUID's last groups can hold a digit run that passes as a card (a221-506039599542 passes Luhn): an approval's
    id in a trace event came out masked, now and then, depending on the id."""
    from audit.masking import mask_text, mask_value

    for uuid in ("cd798f71-6abd-4a7f-a221-506039599542", "41111111-1111-1111-1111-111111111111",
                 "00000000-0000-4000-8000-138123456780"):
        assert mask_text(uuid) == uuid
        assert mask_value({"approval_id": uuid}) == {"approval_id": uuid}
    text = "card 4111 1111 1111 1111 for cd798f71-6abd-4a7f-a221-506039599542, call 13812345678"
    assert mask_text(text) == "card **** **** **** 1111 for cd798f71-6abd-4a7f-a221-506039599542, call 138****5678"


def test_a_hex_id_whose_digits_look_like_a_mobile_number_is_left_whole() -> None:
    # a flow node's call id holds its run's UUID without hyphens; 11 of its digits in a row were masked as a phone
    # number in a stored answer and a trace, so the id no longer matched (seen as a flaky exactly-once test)
    from audit.masking import mask_text

    call = "fl:0a14415484721b3c9d8e7f6a5b4c3d2e:refund"
    assert mask_text(f"dispatched {call}") == f"dispatched {call}"
    assert mask_text("call me on 13812345678") == "call me on 138****5678"
    assert mask_text("电话13812345678") == "电话138****5678"
