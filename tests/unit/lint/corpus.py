"""Prompt texts with their dynamic spans marked, for the detector's precision and recall.

Each case is a piece of a system prompt (or tool description) as an app
would write it. ``[[kind:text]]`` marks a span that changes from request to
request (or from user to user); everything else must be left alone, and
many cases are built around stable look-alikes: versions, status codes,
config values, RFC numbers, token limits, SQL intervals, format masks,
schedules, hotlines, role mailboxes, model names, checksums.

Labelling conventions (decided before running the detector):

* A span is the whole value that changes: ``Monday, November 30, 2026 at
  3:25 PM PST`` is one timestamp; a date with its weekday is one ``date``.
* A time's zone (``PST``, ``UTC``, ``+08:00``) is part of the time.
* A counter's span is its number; an email, phone, id, token is the whole
  value; a person's name without titles or honorifics (``様``, ``先生``).
* "Now" is 2026-11-30T15:30:00Z (``NOW``): dates near it are today's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NOW = 1796052600.0  # 2026-11-30T15:30:00Z

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1XzE4ODIzIiwiZXhwIjoxNzk2MDU1OTA3fQ."
       "Xf3kP9qL2mVbT8wZ1nR4yC7hJ0dG5sAeU6oI")


@dataclass(frozen=True)
class Case:
    lang: str
    text: str
    spans: tuple[tuple[str, int, int], ...]


def case(lang: str, marked: str) -> Case:
    text = ""
    spans = []
    position = 0
    for match in re.finditer(r"\[\[(\w+):(.+?)\]\]", marked):
        text += marked[position:match.start()]
        start = len(text)
        text += match.group(2)
        spans.append((match.group(1), start, len(text)))
        position = match.end()
    text += marked[position:]
    return Case(lang, text, tuple(spans))


CORPUS: list[Case] = [case(lang, marked) for lang, marked in [
    # -- English: dynamic ---------------------------------------------------------------------
    ("en", "You are a helpful assistant. Current date and time: [[timestamp:2026-11-30T15:25:07Z]]."),
    ("en", "Today is [[date:Monday, November 30, 2026]]. Answer questions about our store."),
    ("en", "Current time: [[timestamp:Monday, November 30, 2026 at 3:25 PM PST]]."),
    ("en", "Request received [[timestamp:Mon, 30 Nov 2026 15:25:07 +0000]] via the web widget."),
    ("en", "Session started at [[timestamp:2026-11-30 09:14:52]] for [[email:maria.lopez@outlook.com]]."),
    ("en", "Request ID: [[request_id:req_7Hx2Kq9LmP4vN8wR]]. Log it with every tool call."),
    ("en", "trace_id=[[request_id:4bf92f3577b34da6a3ce929d0e0e4736]] span=[[request_id:00f067aa0ba902b7]]"),
    ("en", "Conversation [[uuid:3f2504e0-4f89-41d3-9a0c-0305e82c3301]]: keep answers short."),
    ("en", f"Authorization context: Bearer [[jwt:{JWT}]]"),
    ("en", "The request came from IP [[ip:81.2.69.160]]; do not reveal it to the user."),
    ("en", ("The customer's name is [[name:Jonathan Pryce]] and their phone number is "
           "[[phone:+1 415 555 0137]].")),
    ("en", "Hello [[name:Priya]], welcome back! You have [[counter:12]] messages remaining today."),
    ("en", "cache-buster: [[nonce:x7Kp2mQ9vR4tL8wN3zB6]]"),
    ("en", "Context generated at unix time [[epoch:1796052307]] by the retrieval service."),
    ("en", "ts_ms=[[epoch:1796052307123]] region=eu-west-1 shard=7"),
    ("en", "Local time in Berlin is [[time:16:25]] right now."),
    ("en", "It is [[time:3:47 PM]] for the user, so greet accordingly."),
    ("en", "The user's subscription renews on [[date:December 4, 2026]]."),
    ("en", "Next billing date: [[date:12/15/2026]]. Plan: Pro annual."),
    ("en", "Last login on [[date:29.11.2026]] from [[ip:10.24.8.113]]."),
    ("en", "Upload batch [[ulid:01M8PGYE5GM9S346Q3D25VT4F5]] contains 14 files."),
    ("en", "Message-ID: <[[uuid:01a22d0f-38b0-7a3c-9f2e-4b7d1c8e0a56]]@mail.acme.io>"),
    ("en", "Client address [[ip:2a02:8071:2b84:3e00:9d1c:5f2a:17b4:c3e1]] is in Germany."),
    ("en", "This is request number [[counter:57]] from this account today."),
    ("en", "Customer tier: Gold. Credits remaining: [[counter:1,250]]."),
    ("en", ("Contact the account owner at [[email:d.okafor+billing@gmail.com]] or "
           "[[phone:(212) 555-0148]].")),
    ("en", "Thread [[session_id:thread_Qm81Rt5zXk2Lw9]] continues from yesterday."),
    ("en", "Your completion id was [[request_id:chatcmpl-9f8e7d6c5b4a3f21]]."),
    ("en", "Data is current as of [[timestamp:2026-11-30 14:00 UTC]]; newer events are unknown."),
    ("en", "Dear [[name:Laura Chen]], thank you for contacting us."),
    ("en", "The user was last active [[relative_time:12 minutes ago]]."),
    ("en", "As of [[date:Nov 30th]], inventory counts are approximate."),
    ("en", "It's currently [[weekday:Monday]] afternoon for the user."),
    ("en", ("Greeting for [[name:Tomás Herrera]]: be warm but brief. Today's date: "
           "[[date:30 November 2026]].")),
    # -- English: stable look-alikes ----------------------------------------------------------
    ("en", "Use Python 3.10 or newer. vLLM 0.6.3 and CUDA 12.1 are installed on the workers."),
    ("en", "Return HTTP 404 when the resource is missing and 429 when the client is rate limited."),
    ("en", ("Set temperature to 0.92 and top_p to 0.95. The context window is 128000 tokens; never "
           "exceed 4096 output tokens.")),
    ("en", "Timestamps follow RFC 3339; email headers follow RFC 2822 and RFC 5322."),
    ("en", "Example query: SELECT * FROM orders WHERE created_at > NOW() - INTERVAL '7 days';"),
    ("en", "Format phone numbers as +1-XXX-XXX-XXXX and dates as YYYY-MM-DD (time as HH:MM)."),
    ("en", "Our office hours are 9:00-17:00, Monday to Friday, and 10:00-14:00 on Saturdays."),
    ("en", "Email support@acme.com or call 1-800-555-0199 for help with your order."),
    ("en", "The API listens on 127.0.0.1:8080; documentation lives at https://docs.acme.com/v2/."),
    ("en", "Step 1: read the ticket. Step 2: reply within 24 hours. Step 3: close it."),
    ("en", "Summaries use gpt-4o-mini-2024-07-18; long documents use claude-3-5-sonnet-20241022."),
    ("en", "Videos must be 16:9 at 1920x1080, 60 fps, and at most 10 minutes long."),
    ("en", "Version 2.4.1 (build 5531) introduced the new billing page."),
    ("en", "Refunds are available within 30 days; orders over $100 ship free to 40 countries."),
    ("en", "Commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed the date parser."),
    ("en", "Hello! How can I help you today? Address the customer politely."),
    ("en", "The current time zone setting for all reports is UTC."),
    ("en", "Error E1042 means the card was declined; error E2001 means the address is invalid."),
    ("en", "Keep answers under 300 words and use at most 3 bullet points."),
    ("en", "Headquarters: 1600 Amphitheatre Parkway, Mountain View, CA 94043."),
    ("en", "Cite the reference edition, ISBN 978-3-16-148410-0, when quoting."),
    ("en", "Use the placeholders {{user_name}} and {{current_date}}; never invent a UUID."),
    ("en", "We guarantee 99.95% uptime per calendar month; maintenance is announced 72 hours ahead."),
    ("en", "Weights: retrieval 0.4, recency 0.35, popularity 0.25. Threshold 0.8."),
    ("en", "Rate limits: 20 requests per minute on the free tier, 600 on Pro, 6000 on Enterprise."),
    ("en", "Chapter 3, section 4.2 describes the 3-2-1 backup rule."),
    ("en", "Call our sales line at 1-888-555-0123 between 8:00 and 18:00 Eastern."),
    # -- English: tool descriptions, JSON and markdown ---------------------------------------
    ("en", ("## Context\n- user: [[email:kenji.watanabe@icloud.com]]\n- plan: team\n"
           "- seats used: [[counter:14]]\n- generated: [[timestamp:2026-11-30T15:24:59.812Z]]")),
    ("en", ('{"user_id": "[[request_id:usr_5Kq8Zt2Wm9Xr]]", "locale": "en-US", "timezone": '
           '"America/New_York", "now": "[[timestamp:2026-11-30T10:25:07-05:00]]"}')),
    ("en", "Search the knowledge base. Only return articles updated after 2019-01-01."),
    ("en", "get_weather(city: str, unit: 'C' | 'F') returns the forecast for the next 7 days."),
    ("en", "You are talking to [[name:Amelia Watson]], who prefers short answers."),
    ("en", "The caller's number is [[phone:+44 20 7946 0958]]; verify it before proceeding."),
    ("en", "Idempotency-Key: [[uuid:6f1c2b9e-3d4a-4e7b-9c8d-2a1f0e5b7c63]]"),
    ("en", "If the user asks for the time, say you do not know it. Never guess dates."),
    ("en", "Retry failed calls up to 3 times with exponential backoff starting at 0.5 s."),
    ("en", "Quote prices in USD with two decimals, e.g. 19.99 or 1,249.00."),
    ("en", "The model was trained on data up to June 2024 and released in September 2024."),
    ("en", "Logs from 10.0.0.0/8 are internal; the public gateway is at 203.0.113.10."),
    ("en", "Welcome back, [[name:Marcus]]! Your last order shipped [[relative_time:2 days ago]]."),
    ("en", "Session expires at [[time:16:55:07 UTC]] unless renewed."),
    ("en", "Shift schedule: mornings 06:00-14:00, evenings 14:00-22:00."),
    ("en", "Escalation matrix v3.2: P1 within 15 minutes, P2 within 4 hours."),
    ("en", "api_key = [[nonce:sk-proj-8fJ2kL9mQ3xZ7vB1nT6wR4yH0cD5gS]] (rotate monthly)"),
    ("en", "Correlation: [[request_id:7c9e6679742549de]] / attempt [[counter:2]]"),
    # -- Chinese: more -----------------------------------------------------------------------
    # -- Chinese ------------------------------------------------------------------------------
    ("zh", "今天是[[date:2026年11月30日，星期一]]。请根据日期回答问题。"),
    ("zh", "当前时间：[[timestamp:2026-11-30 15:25:07]]"),
    ("zh", "现在是[[time:下午3点25分]]，请提醒用户午休结束。"),
    ("zh", "用户姓名：[[name:王小明]]，手机号：[[phone:13812345678]]，邮箱：[[email:wangxm88@163.com]]。"),
    ("zh", "会话ID：[[uuid:9b2c4e61-7d3a-4f8e-a1b5-6c0d2e9f4a37]]，请在日志中引用。"),
    ("zh", "这是您第[[counter:3]]次咨询，剩余[[counter:12]]次免费额度。"),
    ("zh", "北京时间[[timestamp:2026年11月30日 15:25]]，系统维护已完成。"),
    ("zh", "订单创建于[[date:2026/11/29]]，预计三天内发货。"),
    ("zh", "签发日期：[[date:二〇二六年十一月三十日]]"),
    ("zh", "时间：[[timestamp:２０２６－１１－３０　１５：２５]]（服务器时间）"),
    ("zh", "今天[[weekday:星期一]]，客服人员较少，请耐心等待。"),
    ("zh", "客户[[name:李明华]]先生是VIP会员，请优先处理。"),
    ("zh", "用户最后一次登录是在[[relative_time:3小时前]]。"),
    ("zh", "请使用 Python 3.10 以上版本，模型上下文长度为 128000 个 token。"),
    ("zh", "客服热线：400-820-8820，工作时间为每天 9:00-18:00。"),
    ("zh", "退款须在收到商品后 7 天内申请，每周一至周五处理。"),
    ("zh", "第1条：保持礼貌。第2条：不要泄露内部信息。第3条：使用简体中文。"),
    ("zh", "HTTP 状态码 404 表示资源不存在，500 表示服务器错误。"),
    ("zh", "温度参数设置为 0.7，最大输出 2048 个 token，超时 30 秒。"),
    ("zh", "请注意以下3点：第一，核实身份；第二，记录问题；第三，及时回复。"),
    ("zh", "用户是一位新手，请用简单的语言解释。"),
    ("zh", "系统版本 v2.3.1，数据库端口 5432，缓存过期时间 3600 秒。"),
    ("zh", "请求追踪号：[[request_id:req_Zb72Kx9QmW31]]，请勿向用户透露。"),
    ("zh", "当前日期为[[date:2026年11月30日]]，本月促销活动截止到12月31日。"),
    ("zh", "客户经理：[[name:张伟]]，联系电话：[[phone:139 1234 5678]]。"),
    ("zh", "会员积分余额：[[counter:3580]]，可兑换礼品。"),
    ("zh", "每天上午10点发送日报，周末不发送。"),
    # -- Japanese -----------------------------------------------------------------------------
    ("ja", "本日は[[date:2026年11月30日（月）]]です。"),
    ("ja", "現在時刻：[[time:15時25分]]"),
    ("ja", "[[timestamp:令和8年11月30日 15:25]]時点の情報に基づいて回答してください。"),
    ("ja", "お客様のお名前は[[name:佐藤花子]]様です。丁寧に対応してください。"),
    ("ja", "[[name:田中]]様、いつもご利用ありがとうございます。"),
    ("ja", "ご連絡先：[[phone:090-1234-5678]]、メール：[[email:hanako.sato@docomo.ne.jp]]"),
    ("ja", "これは[[counter:5]]回目のお問い合わせです。"),
    ("ja", "ご注文番号は[[request_id:ord_8KfJ2mQx91zT]]です。"),
    ("ja", "最終更新：[[relative_time:5分前]]"),
    ("ja", "サポート窓口は平日 10:00〜18:00 です。フリーダイヤル 0120-123-456 までどうぞ。"),
    ("ja", "Python 3.11 と CUDA 12.1 を使用してください。最大 4096 トークンまで出力できます。"),
    ("ja", "毎週月曜日に定期メンテナンスを行います。"),
    ("ja", "皆様のご意見をお待ちしております。ご利用者様へのお知らせをご確認ください。"),
    ("ja", "HTTP 429 が返った場合は 60 秒待ってから再試行してください。"),
    ("ja", "只今の時刻は[[time:午後3時25分]]です。"),
    ("ja", "セッションID：[[uuid:c7a1e9b2-5f3d-4a8c-b6e0-1d2f3a4b5c6d]]"),
    ("ja", "営業時間は 9:00 から 17:00 まで、土日祝日は休業です。"),
    ("ja", "第2章ではバージョン 1.4.2 の変更点を説明します。"),
    # -- a last batch, written before running the detector on it -----------------------------
    ("en", ("Retrieved documents (fetched [[timestamp:2026-11-30 15:20:44]]):\n[1] Returns policy, "
           "revised 2024-03-15\n[2] Shipping FAQ")),
    ("en", "You are Nova, the assistant for Brightside Bank. Never share account numbers."),
    ("en", "Agent scratchpad id: [[ulid:01M8PGYE5GM9S346Q3D25VT4F5]]; step budget 12."),
    ("en", "Reply in the user's language. The user's locale is fr-CA and currency CAD."),
    ("en", ("User profile: name=[[name:Olivia Martin]], email=[[email:olivia.m@proton.me]], "
           "orders=[[counter:17]]")),
    ("en", "Only answer questions about the Model X (2023 edition) and Model Y (2025 edition)."),
    ("en", "Use 24-hour times (e.g. 14:30) and metric units. Never use emojis."),
    ("en", "Nonce: [[nonce:q9Xw2Lr7Tz4Kb8Nc1Vd6]]. Include it verbatim in the signature."),
    ("en", "Remember: today's date is [[date:2026-11-30]] and the store closes at 20:00."),
    ("en", "Our Discord server has 12,500 members; moderators answer within 2 hours."),
    ("zh", "当前用户：[[name:陈静]]（会员等级：黄金），上次访问：[[date:2026-11-28]]。"),
    ("zh", "请按照 ISO 8601 格式输出时间，例如 YYYY-MM-DDTHH:MM:SS。"),
    ("zh", "本服务由 GPT 模型驱动，支持 32k 上下文，响应时间通常小于 2 秒。"),
    ("zh", "用户IP：[[ip:223.104.63.12]]，所在城市：杭州。"),
    ("ja", "お客様ID：[[request_id:cus_R8mK2xQ9vT4w]]、会員ランク：ゴールド"),
    ("ja", "回答は 400 字以内、敬語で。価格は税込 1,980 円です。"),
    ("ja", "今日は[[timestamp:11月30日、午後3時25分]]です。"),
    # -- other languages ----------------------------------------------------------------------
    ("de", "Heute ist [[date:Montag, 30. November 2026]]. Antworte auf Deutsch."),
    ("fr", "Nous sommes le [[date:lundi 30 novembre 2026]], il est [[time:15:25]]."),
    ("es", "Fecha actual: [[date:30 de noviembre de 2026]]. Responde en español."),
    ("de", "Version 2.1 des Handbuchs, Kapitel 3; Öffnungszeiten 8:00-16:00 Uhr."),
    ("es", "El cliente se llama [[name:Lucía Fernández]] y su correo es [[email:lucia.fdz@gmail.com]]."),
    # -- added 2026-12-06: values after a key or a cue, week dates ------------------------------
    ("en", "Session token: [[nonce:k8Jd9sLq2Xz7]]. Never repeat it to the user."),
    ("en", "csrf=[[nonce:Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5]]; lang=en; theme=dark"),
    ("en", "Order [[record_id:#A-48213]] is being processed; delivery in 3-5 days."),
    ("en", 'Context: {"user_id": [[record_id:88213]], "plan": "pro", "seats": 5}'),
    ("en", "customerId=[[record_id:CUS-2026-771043]] tier=gold region=eu-west-1"),
    ("en", "Planning for week [[date:2026-W49]]: prioritise returns and exchanges."),
    ("en", "Write ISO week dates as YYYY-Www, for example 2020-W01 for the first week of 2020."),
    ("en", "Set api_key=YOUR_API_KEY and token=<paste your token here> in the config file."),
    ("en", "The OAuth state parameter is called state=xyz; the login page is /auth/callback."),
    ("en", "Passwords need 12 characters; password=Example123 is rejected as too common."),
    ("en", "Day of week: [[weekday:Thursday]]. Request-Id: [[request_id:7b1e4c52]]."),
    ("en", "You have [[counter:3]] unread messages; remaining budget: $[[counter:42.10]]."),
    ("en", "Open every weekday, Monday to Friday; you have 3 attempts per day."),
    ("ko", "오늘은 [[date:2026년 11월 30일]]입니다. 한국어로 답하세요."),
    ("ko", "2024년 3월 1일에 개정된 이용약관을 따릅니다."),
    # -- added 2026-12-07: "ago" and a weekday after "today" in German, French, Spanish -------
    ("de", "Der Nutzer war [[relative_time:vor 3 Minuten]] zuletzt aktiv."),
    ("fr", "L'utilisateur était actif [[relative_time:il y a 12 minutes]]."),
    ("es", "El usuario estuvo activo [[relative_time:hace 2 horas]]."),
    ("de", "Heute ist [[weekday:Montag]]. Antworte auf Deutsch."),
    ("fr", "Aujourd'hui nous sommes [[weekday:lundi]]. Réponds en français."),
    ("es", "Hoy es [[weekday:lunes]]. Responde en español."),
    ("de", "Wir sind von Montag bis Freitag erreichbar; die Firma wurde vor 30 Jahren gegründet."),
    ("fr", "Ouvert du lundi au vendredi, il y a toujours un conseiller disponible."),
    ("es", "Abierto de lunes a viernes; la empresa se fundó hace 20 años."),
]]
