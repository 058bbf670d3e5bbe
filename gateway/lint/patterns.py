"""The pattern families, compiled once when a :class:`PatternSet` is built.

Every pattern is written to scan in linear time, whatever the input:

* it starts with a look-behind that forbids starting inside a run of the
  characters it would consume first, so a long run offers one start, not one
  per character;
* every repetition is bounded (``{m,n}``) or made of alternatives that cannot
  match the same text two ways (no ``(a+)+``, no ``(a|a)*``);
* validation (is this a real date, a real UUID, a random-looking id?) is done
  in Python on the match, never by a clever pattern.

The patterns run on NFKC-folded text (see ``normalize``), so they only need
ASCII digits and punctuation. The module holds only constant tables; the
compiled patterns live on the ``PatternSet`` instance.
"""

from __future__ import annotations

import re

MONTH_NAMES = (
    "january jan enero ene janvier janv januar jän",
    "february feb febrero février févr fevrier februar",
    "march mar marzo mars märz maerz",
    "april apr abril abr avril avr",
    "may mayo mai",
    "june jun junio juin juni",
    "july jul julio juillet juil juli",
    "august aug agosto août aout",
    "september sep sept septiembre septembre",
    "october oct octubre octobre oktober okt",
    "november nov noviembre novembre",
    "december dec diciembre dic décembre déc decembre dezember dez")
MONTHS: dict[str, int] = {name: number for number, names in enumerate(MONTH_NAMES, start=1)
                          for name in names.split()}
"""Month names and abbreviations (en, es, fr, de), lower case -> month number. (Spanish
``ago`` for agosto is left out: "3 ago" would read English "ago" as August.)"""
SPANISH_AUGUST = "ago"
"""Spanish ``ago.`` (agosto): a month only with its dot and a year after it, "7 ago. 2026"
(``temporal.month_date``)."""
MONTH_ABBREVIATIONS = frozenset(
    name for name, number in MONTHS.items() if name != "may" and any(
        other != name and other.startswith(name) and MONTHS[other] == number for other in MONTHS))
"""Names that are short for a longer one (``Dec``, ``sept``, ``dic``): a dot after them is
theirs; after a full name (``December.``) it ends the sentence."""

WEEKDAY_NAMES = (
    "monday mon lunes lundi montag",
    "tuesday tue tues martes mardi dienstag",
    "wednesday wed miércoles miercoles mercredi mittwoch",
    "thursday thu thur thurs jueves jeudi donnerstag",
    "friday fri viernes vendredi freitag",
    "saturday sat sábado sabado samedi samstag",
    "sunday sun domingo dimanche sonntag")
WEEKDAYS: dict[str, int] = {name: number for number, names in enumerate(WEEKDAY_NAMES)
                            for name in names.split()}
LONG_WEEKDAYS = frozenset(name for name in WEEKDAYS if len(name) > 3)

CJK_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
JA_WEEKDAYS = {"月": 0, "火": 1, "水": 2, "木": 3, "金": 4, "土": 5, "日": 6}
ERAS = {"令和": 2018, "R": 2018, "平成": 1988, "H": 1988, "昭和": 1925, "S": 1925}
"""Japanese era name -> the Gregorian year before its first year."""

CJK_NUMERALS = {"〇": 0, "零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
                "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}

TIME_ZONES = ("UTC", "GMT", "EST", "EDT", "CST", "CDT", "MST", "MDT", "PST", "PDT", "CET",
              "CEST", "BST", "IST", "JST", "KST", "HKT", "SGT", "AEST", "AEDT", "EET", "EEST",
              "WET", "WEST", "MSK", "NZST", "NZDT", "AKST", "AKDT", "HST")

RELATIVE_BEFORE = ("vor ", "il y a ", "hace ")
"""What comes before the number in German, French and Spanish "ago" (``vor 3 Minuten``,
``il y a 3 minutes``, ``hace 3 minutos``); English and CJK put it after."""

CUE_LITERALS = ("today", "current", "now", "it is", "it's", "it’s", "day of",
                "heute", "aujourd'hui", "aujourd’hui", "nous sommes", "hoy",
                "今天", "今日", "本日", "现在", "現在", "当前", "當前", "目前", "只今")
"""Seeds for a weekday standing alone after a relative phrase ("Today is Monday"); the
``cue`` pattern decides. Hits with digits find their cue by looking back instead."""

NAME_LITERALS = ("name", "hello", "hi ", "hey ", "dear ", "welcome", "talking to",
                 "speaking with", "chatting with", "the user is", "address the user",
                 "the customer is", "the client is", "the caller is", "the guest is",
                 "the patient is",
                 "se llama", "s'appelle", "heißt",
                 "用户", "客户", "会员", "顾客", "姓名", "称呼", "负责人", "联系人", "经办人", "先生", "女士", "小姐", "同学",
                 "お客様", "ユーザー", "利用者", "会員", "氏名", "名前", "様", "さん")

COUNTER_LITERALS = ("#", "remaining", "left", "used", "balance", "credit", "quota", "visit",
                    "attempt", "retry", "turn", "try", "round", "iteration", "step", "queue",
                    "number", "no.", "count", "index", "today", "you have", "seed", "stock",
                    "ungelesen", "neue ", "non lu", "nouveaux", "nouvelles", "sin leer",
                    "nuevos", "no leídos", "unread", "new messag", "new notif", "new mail",
                    "new e-mail", "new email", "page", "question", "slide", "chunk", "item",
                    "第", "剩余", "还剩", "已使用", "已用", "余额", "回目", "残り", "未读", "未讀", "未読")

PROGRESS_WORDS = "page|question|slide|chunk|item"
"""What a prompt walks through one per request: "Page 3 of 10", "Question 4/10" (``step``
has its own rules: a manual's steps are fixed)."""

FUTURE_LITERALS = ("ends in", "expires in", "renews in", "closes in", "starts in", "begins in",
                   "runs out in", "left in", "remaining in", "left on", "remaining on")
"""Seeds for a time to go on a subscription or an offer ("The trial ends in 5 days")."""

RECORD_CUES = (
    "order|account|acct|ticket|case|invoice|booking|reservation|confirmation|tracking|policy"
    "|claim|membership|member|customer|loyalty|reference|ref|transaction|txn|shipment|parcel"
    "|contract|subscription|card|application|incident|loan|patient|employee|student|user")
"""Words before an order, account or ticket number ("order ORD-2024-88812", "Ticket #4821")."""
INTL_RECORD_CUES = (
    "bestellnummer|bestell-nr\\.?|kundennummer|kunden-nr\\.?|auftragsnummer|rechnungsnummer"
    "|vertragsnummer|sendungsnummer|buchungsnummer|vorgangsnummer|ticketnummer|kontonummer"
    "|mitgliedsnummer|fallnummer"
    "|(?:numéro|numero|n°|no\\.?)\\ de\\ (?:commande|client|compte|dossier|facture|suivi"
    "|réservation|reservation|ticket|contrat|membre|colis)"
    "|(?:número|numero|n°|no\\.?)\\ de\\ (?:pedido|cliente|cuenta|factura|seguimiento|reserva"
    "|ticket|contrato|orden|caso|socio|envío|envio)")
"""German, French and Spanish names of those numbers ("Bestellnummer", "Numéro de commande",
"Número de pedido"); ``nº`` folds to ``no`` under NFKC."""
USERNAME_LITERALS = ("username", "user name", "user_name", "user id", "user_id", "userid",
                     "user-id", "login", "handle", "screen name", "screen_name", "benutzername",
                     "nom d'utilisateur", "nombre de usuario")
"""Seeds for a username after its name ("Username: maria.lopez", "user_id: jdoe_88")."""
CJK_RECORD_CUES = (
    "订单号|订单|账号|账户|帐号|帳號|工单|单号|会员号|会员卡号|卡号|客户编号|编号|流水号|合同号"
    "|保单号|预订号|运单号|快递单号|注文番号|会員番号|お問い合わせ番号|予約番号|口座番号|伝票番号"
    "|管理番号|受付番号|顧客番号|チケット番号|注文ID")
STANDARD_PREFIXES = frozenset(
    ["ISO", "RFC", "CVE", "CWE", "PEP", "UTF", "SHA", "MD", "ECMA", "IEEE", "EN", "DIN", "JIS", "GB", "ANSI", "COVID", "HTTP", "TLS", "SSL", "IPV", "X", "MP", "H", "ES", "TS", "PY", "CP", "WIN", "AES", "RSA", "ISBN", "ISSN", "GPT", "LLAMA", "QWEN", "BERT", "T5", "GDPR", "HIPAA", "SOC", "PCI", "NIST", "FIPS", "OWASP", "E", "IP", "W3C", "ASCII", "USB", "PCIE", "DDR", "LTE", "NR", "AVX", "SSE", "ARM"])
"""Prefixes of standards and model families: ``ISO-8601``, ``RFC-9110``, ``CVE-2024-3094``
name one fixed document, the same in every request."""

_A = "A-Za-z0-9"
"""ASCII alphanumerics: the boundary class of most patterns (CJK text around is fine)."""


def _alternation(words: list[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


class PatternSet:
    """Every compiled pattern of the detector."""

    def __init__(self) -> None:
        weekday = _alternation(list(WEEKDAYS))
        zones = _alternation(list(TIME_ZONES))
        flags = re.VERBOSE
        self.seed_digits = re.compile(r"[0-9][0-9:/.\-]{0,64}")
        self.non_digits = re.compile(r"[^0-9]+")
        self.iso_datetime = re.compile(rf"""
            (?<![{_A}./-])
            (?P<y>[0-9]{{4}})-(?P<mo>[0-9]{{2}})-(?P<d>[0-9]{{2}})
            [T\ ](?P<h>[0-9]{{2}}):(?P<mi>[0-9]{{2}})
            (?::(?P<s>[0-9]{{2}})(?:[.,](?P<f>[0-9]{{1,9}}))?)?
            (?P<tz>Z|[+-][0-9]{{2}}(?::?[0-9]{{2}})?)?
            (?P<zone>\ (?:{zones})(?![A-Za-z]))?
            (?![{_A}]|[.:][0-9])""", flags)
        self.num_date = re.compile(rf"""
            (?<![{_A}./,-])
            (?:(?P<y1>[12][0-9]{{3}})(?P<s1>[-/.])(?P<m1>[0-9]{{1,2}})(?P=s1)(?P<d1>[0-9]{{1,2}})
              |(?P<a2>[0-9]{{1,2}})(?P<s2>[-/.])(?P<b2>[0-9]{{1,2}})(?P=s2)(?P<y2>[12][0-9]{{3}})
              |(?P<a3>[0-9]{{1,2}})/(?P<b3>[0-9]{{1,2}})/(?P<y3>[0-9]{{2}})
              |(?P<d4>[0-9]{{1,2}})\.(?P<m4>[0-9]{{1,2}})\.(?P<y4>[0-9]{{2}}))
            (?![{_A}]|[-/.,:][0-9])""", flags)
        self.compact_date = re.compile(
            rf"(?<![{_A}_.-])(?P<y>(?:19|20)[0-9]{{2}})(?P<m>[01][0-9])(?P<d>[0-3][0-9])"
            rf"(?![{_A}_-]|\.[0-9])")
        self.month_date = re.compile(rf"""
            (?<![{_A}.:/-])(?P<day>(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th|er)?\.?)
            (?:\ {{1,2}}(?:of\ |de\ )?(?P<mon>[^\W\d_]{{3,10}})\.?
                 (?:,?\ {{1,2}}(?:de\ )?(?P<y2>[12][0-9]{{3}}))?
              |,?\ {{1,2}}(?P<y1>[12][0-9]{{3}}))?
            (?![{_A}]|[.:][0-9])""", flags)
        self.dash_month_date = re.compile(rf"""
            (?<![{_A}./-])(?P<d>[0-9]{{1,2}})(?P<sep>[-/])(?P<mon>[A-Za-z]{{3,9}})(?P=sep)
            (?P<y>[12][0-9]{{3}})(?![{_A}]|[-/.:][0-9])""", flags)
        """``7-Dec-2026``, ``07/Dec/2026`` (logs, Oracle, Apache)."""
        self.french_time = re.compile(
            rf"(?<![{_A}:.])(?P<h>[0-9]{{1,2}})(?:h|[ \u00a0\u202f]h[ \u00a0\u202f])"
            rf"(?P<mi>[0-5][0-9])(?![{_A}]|[.:][0-9])")
        """``14h32``, ``14 h 32``: the French way to write a time of day (a bare ``9h`` or
        ``9 h`` is a schedule's)."""
        self.month_before = re.compile(r"(?P<mon>[^\W\d_]{3,10})\.?\ {1,2}$")
        self.cjk_date = re.compile(r"""
            (?<![0-9])
            (?:(?P<y>[0-9]{1,4})\s?[年년]\s?)?
            (?P<m>[0-9]{1,2})\s?[月월]\s?(?P<d>[0-9]{1,2})\s?[日号號일]""", flags)
        self.era_before = re.compile(r"(?P<era>令和|平成|昭和|(?<![A-Za-z])[RHS])(?P<first>元年\s?)?$")
        self.cjk_numeral_date = re.compile(
            r"(?P<y>[〇零一二三四五六七八九]{4})年(?P<m>[一二三四五六七八九十]{1,3})月"
            r"(?P<d>[一二三四五六七八九十]{1,3})[日号]")
        self.time = re.compile(rf"""
            (?<![{_A}:.])
            (?P<h>[0-9]{{1,2}}):(?P<mi>[0-5][0-9])
            (?::(?P<s>[0-5][0-9]|60)(?:[.,](?P<f>[0-9]{{1,9}}))?)?
            (?:\ ?(?P<ap>[AaPp])\.?[Mm]\.?(?![A-Za-z]))?
            (?P<tz>Z(?![A-Za-z])|\ ?[+-][0-9]{{2}}:?[0-9]{{2}}
               |\ ?(?:{zones})(?:[+-][0-9]{{1,2}}(?::?[0-9]{{2}})?)?(?![A-Za-z])
               |\ ?\((?:UTC|GMT)[+-][0-9]{{1,2}}(?::?[0-9]{{2}})?\))?
            (?![{_A}:]|[.,][0-9])""", flags)
        self.cjk_time = re.compile(r"""
            (?<![0-9])(?P<h>[0-9]{1,2})\s?[点點時时]\s?
            (?:(?P<mi>[0-9]{1,2})\s?分(?:\s?(?P<s>[0-9]{1,2})\s?秒)?|(?P<half>半))?""", flags)
        self.ampm_before = re.compile(r"(?P<pre>上午|下午|早上|中午|晚上|凌晨|傍晚|午前|午後)\s?$")
        self.prefix_before = re.compile(
            r"(?<![A-Za-z0-9_-])(?P<prefix>req|request|sess|session|chatcmpl|cmpl|msg|run|thread"
            r"|call|evt|event|txn|trace|span|conv|resp|job|task|ord|order|cus|sub|inv|usr|acct|sk|pk"
            r"|key)$", re.IGNORECASE)
        self.weekday = re.compile(rf"""
            (?<![A-Za-z])(?P<en>{weekday})(?P<plural>s)?(?P<dot>\.)?(?![A-Za-z])
            |(?P<zh>星期|礼拜|禮拜|周|週)(?P<zhd>[一二三四五六日天])
            |(?P<ja>[月火水木金土日])曜(?:日)?
            |\((?P<paren>[月火水木金土日]|(?i:mon|tue|wed|thu|fri|sat|sun))\)""",
                                  flags | re.IGNORECASE)
        self.relative_time = re.compile(r"""
            (?<![A-Za-z0-9.])[0-9]{1,3}\ ?(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?
              |months?)\ ago(?![A-Za-z])
            |(?<![A-Za-z])vor\ [0-9]{1,3}\ (?:Sekunden?|Minuten?|Stunden?|Tag(?:en)?|Wochen?
              |Monat(?:en)?)(?![A-Za-z])
            |(?<![A-Za-z])il\ y\ a\ [0-9]{1,3}\ (?:secondes?|minutes?|heures?|jours?|semaines?
              |mois)(?![A-Za-z])
            |(?<![A-Za-z])hace\ [0-9]{1,3}\ (?:segundos?|minutos?|horas?|d[ií]as?|semanas?
              |mes(?:es)?)(?![A-Za-z])
            |(?<![0-9の])[0-9]{1,3}\s?(?:秒钟|秒鐘|秒|分钟|分鐘|分|小时|小時|時間|天|日|周|週間|个月|ヶ月|か月)
              \s?(?:前|以前)(?!まで)""", flags | re.IGNORECASE)
        self.iso_week = re.compile(
            rf"(?<![{_A}.-])(?P<y>(?:19|20)[0-9]{{2}})-?W(?P<w>0[1-9]|[1-4][0-9]|5[0-3])"
            rf"(?:-?[1-7])?(?![{_A}]|[.-][0-9])")
        self.epoch = re.compile(
            rf"(?<![{_A}.,:-])(?P<sec>1[0-9]{{9}})(?:(?P<ms>[0-9]{{3}})|\.(?P<frac>[0-9]{{1,6}}))?"
            rf"(?![{_A}]|[.,][0-9])")
        self.uuid = re.compile(
            rf"(?<![{_A}-])[0-9A-Fa-f]{{8}}-[0-9A-Fa-f]{{4}}-[0-9A-Fa-f]{{4}}-"
            rf"[0-9A-Fa-f]{{4}}-[0-9A-Fa-f]{{12}}(?![{_A}-])")
        self.ulid = re.compile(rf"(?<![{_A}])[0-7][0-9A-HJKMNP-TV-Z]{{25}}(?![{_A}])")
        self.hex_id = re.compile(
            rf"(?<![{_A}_-])(?:[0-9a-f]{{16,64}}|[0-9A-F]{{16,64}})(?![{_A}_-])")
        self.prefixed_id = re.compile(
            rf"[_-](?P<body>[{_A}][{_A}_-]{{5,96}})(?![{_A}_-])")
        self.jwt = re.compile(
            rf"(?<![{_A}_-])eyJ[{_A}_-]{{4,2048}}\.eyJ[{_A}_-]{{4,8192}}\.[{_A}_-]{{0,2048}}"
            rf"(?![{_A}_-])")
        self.email = re.compile(rf"""
            (?<![{_A}._%+-])
            (?P<local>[{_A}][{_A}._%+-]{{0,63}})@
            (?P<domain>(?:[{_A}](?:[{_A}-]{{0,61}}[{_A}])?\.){{1,8}}[A-Za-z]{{2,24}})
            (?![{_A}-])""", flags)
        self.ipv4 = re.compile(
            rf"(?<![{_A}.])(?:[0-9]{{1,3}}\.){{3}}[0-9]{{1,3}}(?![{_A}]|\.[0-9]|/[0-9])")
        self.ipv6 = re.compile(
            rf"(?<![{_A}:.])[0-9A-Fa-f]{{0,4}}(?::[0-9A-Fa-f]{{0,4}}){{2,7}}(?![{_A}:])")
        self.phone = re.compile(rf"""
            (?<![{_A}+])
            (?:(?P<intl>\+[0-9]{{1,3}}[\ .-]?\(?[0-9][0-9\ ().-]{{5,18}}[0-9])
              |(?P<nanp>(?:1[\ .-]?)?\(?[2-9][0-9]{{2}}\)?[\ .-]?[2-9][0-9]{{2}}[\ .-][0-9]{{4}})
              |(?P<cn>1[3-9][0-9](?:[0-9]{{8}}|[\ -][0-9]{{4}}[\ -][0-9]{{4}}))
              |(?P<jp>0[0-9]{{1,4}}-[0-9]{{1,4}}-[0-9]{{3,4}}))
            (?![{_A}]|[-.][0-9])""", flags)
        self.nonce = re.compile(
            rf"(?<![{_A}+/_-])(?<![^{_A}_]=)[{_A}+/_-]{{16,256}}={{0,2}}(?![{_A}+/_=-])")
        """A random-looking string of 16 characters or more; after ``=`` only as a key's value
        (``csrf=...``), not after padding or another ``=``."""
        self.cued_nonce = re.compile(rf"""
            (?<![A-Za-z])(?i:token|nonce|csrf|xsrf|secret|otp|signature|sig|salt
              |(?:request|trace|correlation)[\ _-]?id
              |api[\ _-]?key|access[\ _-]?key|session(?:[\ _-]?(?:id|key|token))?)
            (?:\ (?i:is))?\ ?[:=]\ ?["']?
            (?P<value>[{_A}+/_-]{{8,15}}={{0,2}})(?![{_A}+/_=-])""", flags)
        """A shorter random-looking value right after a token's or a secret's name."""
        self.counter_label = re.compile(rf"""
            (?<![A-Za-z])
            (?:(?:request|call|turn|message|attempt|visit|query|conversation|session|login
                |ticket|order|case|invoice|question)s?\ ?(?:\#|no\.|number|count|counter|index)
                \ ?:?\ ?\#?
              |remaining\ (?:budget|balance|credits?|quota|tokens|requests|messages)\ ?[:=]\ ?[$€£¥]?
              |(?:remaining|left|used|balance|credits?(?:\ (?:left|remaining))?
                |quota(?:\ (?:left|remaining|used))?|visits|(?:requests|messages|calls)\ today
                |(?:login|visit|session)\ count)\ ?[:=]\ ?[$€£¥]?
              |you\ have\ (?=[0-9]{{1,9}}\ (?:new|unread|pending)\ [a-z]+)
              |you\ have\ (?=[0-9]{{1,9}}\ (?:messages|requests|credits|questions|queries|calls
                |tokens|attempts)\ (?:left|remaining))
              |(?:retry|retries|step)\ ?(?:\#|no\.|number|count|counter|index)\ ?:?\ ?\#?
              |(?:queue\ position|position\ in\ (?:the\ )?queue|place\ in\ (?:the\ )?queue
                |(?:in\ )?stock(?:\ level)?|inventory)\ ?[:=]\ ?)
            (?P<n>[0-9](?:[0-9,]{{0,12}}[0-9])?(?:\.[0-9]{{1,4}})?)
            (?![{_A}]|[.,:/-][0-9])""", flags | re.IGNORECASE)
        self.counter_progress = re.compile(rf"""
            (?<![A-Za-z])
            (?:(?:this\ is|you\ are\ on|you['’]re\ on|(?:currently|now)\ on)\ (?:the\ )?
                (?:attempt|retry|try|turn|round|iteration)\ (?P<n1>[0-9]{{1,6}})
              |(?:you\ are\ on|you['’]re\ on|(?:currently|now)\ on)\ (?:the\ )?step
                \ (?P<n3>[0-9]{{1,6}})
              |this\ is\ (?:the\ )?step\ (?P<n4>[0-9]{{1,6}})(?=\ ?(?:/|of\ )\ ?[0-9])
              |(?:attempt|retry|try)\ (?P<n2>[0-9]{{1,6}})(?=\ ?(?:/|of\ )\ ?[0-9])
              |(?:{PROGRESS_WORDS})\ (?P<n5>[0-9]{{1,6}})(?=\ ?(?:/|of\ )\ ?[0-9])
              |step\ (?P<n6>[0-9]{{1,6}})(?=\ ?/\ ?[0-9]{{1,6}}(?![0-9]|\ ?:)))
            (?![{_A}]|[.,:-][0-9])""", flags | re.IGNORECASE)
        """Where a run is now: "This is attempt 3 of 5", "Attempt 3/5", "You are on step 4",
        "Page 3 of 10", "Question 4/10", "step 2/5" ("(This is) step 1 of the setup guide"
        names a fixed part of a manual, and so do "Step 1 of 3" and a "Step 2/5:" heading)."""
        self.counter_amount = re.compile(r"""
            (?<![A-Za-z0-9.,])
            (?:only\ (?P<n1>[0-9](?:[0-9,]{0,8}[0-9])?)\ (?:[A-Za-z-]{1,16}\ ){0,2}
                (?:left|remaining)(?![A-Za-z])
              |(?P<n2>[0-9](?:[0-9,]{0,8}[0-9])?)\ (?:[A-Za-z-]{1,16}\ ){0,2}
                (?:left|remaining)\ in\ stock(?![A-Za-z])
              |(?P<n4>[0-9]{1,6})\ (?=(?:new\ )?unread\ (?:messages?|notifications?|e-?mails?
                |mails?|alerts?|replies|comments|chats?|DMs?)(?![A-Za-z])
                |new\ (?:messages?|notifications?|e-?mails?|mails?)(?![A-Za-z]))
              |(?P<n3>[0-9]{1,6})\ (?=(?:ungelesene|neue)\ (?:Nachricht|E-Mail|Mail|Mitteilung
                |Benachrichtigung)
                |(?:nouveaux\ |nouvelles\ )?(?:messages|notifications|e-mails|courriels|mails)
                  \ non\ lu
                |(?:nouveaux|nouvelles)\ (?:messages|notifications|e-mails|courriels)
                |(?:mensajes|notificaciones|correos)\ (?:sin\ leer|nuevos|no\ le[ií]dos)
                |nuevos\ (?:mensajes|correos|notificaciones)))""", flags | re.IGNORECASE)
        """Amounts left and unread counts without a label: "Only 17 units left",
        "12 unread messages", "3 new notifications", "12 ungelesene Nachrichten",
        "12 messages non lus", "12 mensajes sin leer" (the English ones not after a limit:
        ``limit_before``)."""
        self.limit_before = re.compile(
            r"(?:at\ most|up\ to|max(?:imum)?|no\ more\ than|more\ than|fewer\ than"
            r"|less\ than|over|the\ (?:last|first|latest|top)|last|first|top)\ $",
            re.IGNORECASE)
        """A limit before a count ("Show at most 20 unread messages"): fixed config."""
        self.seed = re.compile(rf"""
            (?<![A-Za-z])(?:random\ seed\ ?(?:[:=]|is)?\ ?(?P<n1>[0-9]{{1,20}})
              |seed\ ?[:=]\ ?(?P<n2>[0-9]{{4,20}}))
            (?![{_A}]|[.,][0-9])""", flags | re.IGNORECASE)
        """A random seed drawn per request (a short fixed one, ``seed: 42``, is config)."""
        self.relative_future = re.compile(r"""
            (?<![A-Za-z])(?:trial|subscription|plan|membership|offer|promotion|promo|sale
              |discount|deal|license|licence|reservation|hold|coupon|voucher)
            (?:\ period)?\ (?:ends|expires|renews|closes|starts|begins|runs\ out)\ 
            (?P<r1>in\ [0-9]{1,3}\ (?:minutes?|hours?|days?|weeks?|months?))(?![A-Za-z])
            |(?<![A-Za-z0-9])(?P<r2>[0-9]{1,3}\ (?:minutes?|hours?|days?|weeks?|months?)
              \ (?:left|remaining))\ (?:in|on|of)\ (?:your|the|this)\ (?:free\ )?
              (?:trial|subscription|plan|membership|offer|promotion|sale|license|licence)
              (?![A-Za-z])""", flags | re.IGNORECASE)
        """Time to go on the user's own trial, plan or offer: "The trial ends in 5 days",
        "3 days left in your trial" (a policy's "links expire in 24 hours" is fixed)."""
        self.counter_position = re.compile(
            rf"(?<![A-Za-z])(?:attempt|retry|turn|try|round|iteration|visit)\ (?P<n>[0-9]{{1,6}})"
            rf"(?![{_A}]|[.,:/-][0-9]|\ (?:times|attempts|retries|turns|tries|rounds|of\ [0-9]))",
            re.IGNORECASE)
        self.counter_ordinal = re.compile(
            rf"(?<![{_A}])(?P<n>[0-9]{{1,6}})(?:st|nd|rd|th)\ (?=(?:visit|request|message"
            rf"|conversation|session|call|login|time|attempt|question)s?\b)",
            flags | re.IGNORECASE)
        self.counter_cjk = re.compile(r"""
            第\s?(?P<n1>[0-9]{1,6})\s?(?:次|轮|輪|回(?!答))
            |(?:剩余|还剩|已使用|已用|余额|残り)\s?[:：]?\s?(?P<n2>[0-9](?:[0-9,]{0,8}[0-9])?)
            |(?P<n3>[0-9]{1,6})\s?回目
            |(?P<n4>[0-9]{1,6})\s?(?:条|條|封|个|個|件)(?:の)?\s?(?:新)?未[读讀読]
            |未[读讀読](?:的)?(?:消息|信息|邮件|郵件|通知|メッセージ|メール)?\s?(?:が|は|[:：])?\s?
              (?P<n5>[0-9]{1,6})\s?(?:条|條|封|个|個|件)?(?![0-9])""", flags)
        self.cue = re.compile(r"""
            (?:today(?:'s|’s)?(?:\ date)?|current\ (?:date|time|datetime|day|weekday)
              |day\ of\ (?:the\ )?week
              |currently|date\ today|the\ (?:time|date)|time\ now|local\ time|now|as\ of
              |it\ is|it's|it’s)
            (?:\ (?:is|are|was))?(?:\ now|\ currently)?\ ?[:=,]?
            |(?:heute(?:\ ist)?|aujourd['’]hui(?:,?\ (?:nous\ sommes|c['’]est|on\ est))?
              |nous\ sommes|hoy(?:\ es)?)\ ?[:=,]?
            |今天(?:是)?|今日(?:は)?|本日(?:は)?|现在(?:是|时间是?)?|現在(?:は|時刻は?|の時刻は?)?
            |当前(?:时间|日期)(?:是|为)?|當前(?:時間|日期)(?:是|為)?|目前(?:是)?""",
                              flags | re.IGNORECASE)
        self.version_before = re.compile(
            r"(?:\bv|\bver\.?|version|release|build|rev\.?|python|cuda|node|ubuntu|vllm|"
            r"torch|driver|firmware|\bos)\s{0,2}$", re.IGNORECASE)
        self.fingerprint_before = re.compile(
            r"(?:commit|sha(?:-?(?:1|224|256|384|512))?|md5|checksum|hash|digest|fingerprint|etag)"
            r"(?:\ (?:is|was))?\s{0,2}[:=#]?\s{0,2}$",
            re.IGNORECASE)
        self.name_en = re.compile(r"""
            (?:(?i:(?:user|customer|client|member|patient|student|caller|account\ holder)(?:'s|’s)?
                \ (?:full\ |first\ |display\ |preferred\ )?name)\ ?(?:is|:|=)\ ?
              |(?m:^)(?i:name|full\ name)\ ?:\ ?
              |(?<![A-Za-z_])(?i:name|full_name|user_name|username)=
              |(?i:you\ are\ (?:talking|speaking|chatting)\ (?:to|with))\ 
              |(?i:address\ the\ user\ (?:as|by))\ 
              |(?i:the\ (?:user|customer|client|caller|guest|patient)\ is)\ 
              |(?:se\ llama|s'appelle|heißt)\ 
              |(?:Hello|Hi|Hey|Dear|Welcome\ back|Welcome),?\ )
            (?P<name>[A-ZÀ-Þ][a-zß-ÿ'’-]{1,20}(?:\ [A-ZÀ-Þ][a-zß-ÿ'’-]{1,20}){0,3})
            (?![A-Za-zÀ-ÿ])""", flags)
        self.name_zh = re.compile(r"""
            (?:(?:用户|客户|会员|顾客|学员|患者|来访者|当前用户|客户经理|负责人|联系人|经办人)
               (?:名|姓名|的名字|名字|称呼)?
               \s?(?:是|为|:|叫)\s?|(?:姓名|称呼)\s?:\s?)
            (?P<name>[\u4e00-\u9fff]{2,4})
            |(?P<name2>[\u4e00-\u9fff]{2,3})(?=先生|女士|小姐|同学)""", flags)
        self.name_ja = re.compile(r"""
            (?:(?:お客様|ユーザー|利用者|会員|氏名|名前|お名前)(?:名|の名前|のお名前)?\s?(?:は|:)\s?)
            (?P<name>[\u4e00-\u9fff\u30a0-\u30ff]{2,8}?)(?=\s?(?:様|さん|です|。|、|\n|$))
            |(?<![\u4e00-\u9fff\u30a0-\u30ffお])(?P<name2>[\u4e00-\u9fff]{2,4})(?=様|さん)""",
                                  flags)
        self.record_id = re.compile(
            r"(?<![A-Za-z0-9_#&/.-])(?P<id>\#(?:[A-Za-z]{1,4}-?)?[0-9]{3,12}"
            r"|(?=[A-Za-z0-9_/-]{0,39}[0-9])[A-Za-z0-9](?:[A-Za-z0-9]|[-_/](?=[A-Za-z0-9])){3,39})"
            r"(?![A-Za-z0-9_#-]|[./][A-Za-z0-9])")
        self.record_cue = re.compile(rf"""
            (?:(?<![A-Za-z])(?i:{RECORD_CUES})(?:[\ _-]?(?i:id|no\.?|number|num|code|ref))?
               ["']?(?:\ (?i:is))?\ ?[:=\#]?\ ?["']?
              |(?<![A-Za-z])(?i:{INTL_RECORD_CUES})(?:\ (?i:ist|est|es))?\ ?[:=\#]?\ ?
              |(?:{CJK_RECORD_CUES})(?:号|ID|编号)?(?:是|为|は)?\s?[:：]?\s?)$""", flags)
        self.username = re.compile(rf"""
            (?<![A-Za-z])(?i:user[\ _-]?name|user[\ _-]?id|login[\ _-]?(?:name|id)
              |(?:user|twitter|instagram|telegram|social)\ handle|screen[\ _-]?name
              |benutzername|nom\ d'utilisateur|nombre\ de\ usuario)
            (?:\ (?i:is))?\ ?[:=]\ ?["'@]?
            (?P<value>[{_A}](?:[{_A}]|[._-](?=[{_A}])){{1,38}})(?![{_A}_-]|\.[{_A}])""", flags)
        """A username after its name: "Username: maria.lopez", "user_id: jdoe_88"."""
        self.handle = re.compile(rf"""
            (?<![{_A}._%+-])@(?P<value>[A-Za-z][{_A}_]{{1,29}})(?![{_A}_@-]|\.[{_A}])
            """, flags)
        """An @-handle (``@maria_lopez88``); one without a digit counts after a cue only
        (``@dataclass``, ``@lru_cache`` are code)."""
        self.handle_cue = re.compile(
            r"(?i:handle|username|user|twitter|instagram|telegram|slack|mention|dm)\W{0,3}$")
        self.example_inline = re.compile(r"""
            (?<![A-Za-z])(?:e\.\ ?g\.|eg\.|for\ example|for\ instance|such\ as|examples?|samples?
              |z\.\ ?b\.|par\ exemple|por\ ejemplo)(?![A-Za-z])
            |例如|比如|例えば""", flags | re.IGNORECASE)
        """Words that introduce an example value ("e.g. ORD-2024-88812", "the example UUID
        ..."): the value is one fixed illustration, not the request's own."""
        self.example_label = re.compile(r"""
            (?<![A-Za-z])(?:examples?|samples?|few-shot\ examples?)
            (?:\ (?:conversations?|dialog(?:ue)?s?|exchanges?|inputs?|outputs?|answers?|replies
                |responses?|requests?|queries|query|interactions?|chats?|turns?|sessions?|usage
                |of\ (?:an?\ |good\ |bad\ )?[A-Za-z-]{1,16}))?
            (?:\ [0-9]{1,2})?\ ?:
            |(?:例|示例|例子|样例|入力例|出力例)\s?[:：]""", flags | re.IGNORECASE)
        """A label that opens a block of examples (few-shot turns): "Example:", "Examples of
        good answers:", "Example conversation 2:", "示例：". The block runs to the next blank
        line. ("Sample rate:" is a setting, not a label.)"""
        self.time_range_after = re.compile(
            r"\s{0,2}(?:-|–|—|~|～|to|until|till|à|bis|hasta|al|至|到|から)\s{0,2}[0-9]")
        self.time_range_before = re.compile(
            r"[0-9]\s{0,2}(?:-|–|—|~|～|to|until|till|à|bis|hasta|al|至|到|から)\s{0,2}$")
        self.temporal_gap = re.compile(
            r"(?:[\s,，、]|at|@|T|um|à|a las|le|of|de|の)*", re.IGNORECASE)

ZH_SURNAMES = frozenset(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏"
    "吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱"
    "严覃武戴莫孔向汤常温康施文牛樊葛邢安齐易乔伍庞颜倪庄聂章鲁岳翟殷詹申欧耿关兰焦俞左柳甘祝包宁"
    "尚符舒阮柯纪梅童凌毕单季裴霍涂成苗谷盛曲翁冉骆蓝路游辛靳管柴蒙鲍华喻祁蒲房滕屈饶解牟艾尤阳时"
    "穆农司卓古吉缪简车项连芦麦褚娄窦戚岑景党宫费卜冷晏席卫米柏宗瞿桂全佟应臧闵苟邬边卞姬师和仇栾"
    "隋商刁沙荣巫寇桑郎甄丛仲虞敖巩明佘池查麻苑迟邝")
ZH_COMPOUND_SURNAMES = frozenset({"欧阳", "司马", "上官", "诸葛", "东方", "皇甫", "慕容", "令狐",
                                  "司徒", "夏侯", "端木", "公孙", "尉迟", "长孙", "宇文"})
ZH_HONORIFICS = ("先生", "女士", "小姐", "同学", "老师")
JA_NOT_NAME_ENDINGS = tuple("者員客人皆方位様")
EN_NOT_NAMES = frozenset(
    ["world", "there", "everyone", "everybody", "all", "team", "user", "users", "customer", "customers", "sir", "madam", "friend", "friends", "folks", "guest", "guests", "assistant", "support", "again", "back", "today", "welcome", "thanks", "please", "the", "this", "valued", "dear", "member", "members", "human", "agent", "bot", "admin", "student", "students", "there"])
