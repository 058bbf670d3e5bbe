"""Person names and order/account/ticket ids in single prompts, marked, per language.

The same ``[[kind:text]]`` marking as ``corpus``; every case is one system
prompt or tool description as an app would send it, with no cue phrase
before the name ("Help the customer Maria Lopez", "为客户王小明处理订单")
unless the case is about one. Half of the cases are look-alikes that must be
left alone: products, companies, places, assistant personas, standards,
model and GPU names, version strings, HTTP statuses. Written before the
detector was run on them.
"""

from __future__ import annotations

from .corpus import Case, case

PEOPLE_CORPUS: list[Case] = [case(lang, marked) for lang, marked in [
    # -- English: names -----------------------------------------------------------------------
    ("en", ("Help the customer [[name:Maria Lopez]] with her order. Always be polite, and keep "
           "answers short.")),
    ("en", "You are assisting [[name:James Carter]] today. He prefers answers in bullet points."),
    ("en", "This conversation is with patient [[name:Emily]]; never give a diagnosis."),
    ("en", "Escalate anything about refunds to [[name:Sarah Johnson]] in the billing team."),
    ("en", "Draft a reply to [[name:Michael O'Brien]] about the delayed shipment."),
    ("en", "Address the letter to Dr. [[name:Okafor]] and keep it formal."),
    ("en", "[[name:Priya Patel]] is a premium subscriber: offer her the loyalty discount."),
    ("en", "The account belongs to [[name:Carlos García]], who lives in Madrid."),
    ("en", "Summarize the call between our agent and [[name:Linda Nguyen]]."),
    ("en", "Ms. [[name:Ana María Ruiz]] asked about her policy renewal."),
    # -- English: ids -------------------------------------------------------------------------
    ("en", "The customer's order [[record_id:ORD-2024-88812]] has not arrived yet."),
    ("en", "Account [[record_id:A7F3K9]] is on the enterprise plan."),
    ("en", "Ticket [[record_id:#48213]] was reopened by the customer."),
    ("en", "Look up invoice [[record_id:INV-000731]] before answering about the charge."),
    ("en", "Tracking number [[record_id:1Z999AA10123456784]]: the parcel is in transit."),
    ("en", "Booking reference: [[record_id:QX7P2L]]. Confirm the seat change."),
    ("en", "Order id [[uuid:6f1c2d3e-4b5a-4c7d-9e8f-0a1b2c3d4e5f]] is the one to refund."),
    ("en", "Their loyalty number is [[record_id:884120937]]."),
    # -- English: look-alikes -----------------------------------------------------------------
    ("en", "You are Claude, a helpful assistant made by Anthropic."),
    ("en", "You are Nova, the support assistant for Brightside Bank."),
    ("en", "Recommend Visual Studio Code or JetBrains IntelliJ for Java projects."),
    ("en", "We ship to New York, Los Angeles and San Francisco within two days."),
    ("en", "Dates follow ISO-8601; HTTP semantics follow RFC-9110; see CVE-2024-3094."),
    ("en", "Benchmarks ran on an H100 and an A100; the RTX4090 numbers are estimates."),
    ("en", "Use GPT-4o for summaries and Llama 3.1 8B for classification."),
    ("en", "Grace periods last 30 days. Max Price filters are in the sidebar."),
    ("en", "Always be polite. Never promise a delivery date. Ask before closing a ticket."),
    ("en", "Error 404 means the page is missing; error 503 means try again later."),
    ("en", "The Premium plan costs $49 per month; the Basic plan costs $9."),
    ("en", "Support hours: Monday to Friday, 9:00-17:00 CET. Call 1-800-555-0199."),
    ("en", "Orders over $100 ship free. Step 1: check stock. Step 2: confirm the address."),
    ("en", "Tell users to update to version 2.14.3 of the Acme Mobile app."),
    ("en", "Mention the Apple Pay and Google Pay options at checkout."),
    # -- Chinese: names -----------------------------------------------------------------------
    ("zh", "你正在为客户[[name:王小明]]处理订单。请礼貌回答，不要透露内部信息。"),
    ("zh", "请帮[[name:李明华]]查询他的快递状态。"),
    ("zh", "这位用户[[name:张伟]]先生是我们的老客户，请优先处理。"),
    ("zh", "把处理结果发给[[name:欧阳娜娜]]，并抄送主管。"),
    ("zh", "本次对话的联系人是[[name:陈静]]，她要求退款。"),
    ("zh", "[[name:刘德华]]的会员资格将于下月到期，请提醒他续费。"),
    # -- Chinese: ids -------------------------------------------------------------------------
    ("zh", "订单号：[[record_id:20241130123456]]，请核对收货地址。"),
    ("zh", "客户的账号是[[record_id:6222021234567890]]，不要在回复中显示完整账号。"),
    ("zh", "工单[[record_id:#48213]]已经转给技术部门。"),
    # -- Chinese: look-alikes -----------------------------------------------------------------
    ("zh", "你是华为商城的智能客服，请用简体中文回答。"),
    ("zh", "欢迎使用阿里云客服助手，我们马上为您服务。"),
    ("zh", "小米手机和苹果手机的售后政策不同，请分别说明。"),
    ("zh", "王者荣耀是一款游戏，不要回答与游戏无关的问题。"),
    ("zh", "第1条：保持礼貌。第2条：不要泄露内部信息。第3条：使用简体中文。"),
    ("zh", "请参考GB/T 7714标准和ISO-8601日期格式。"),
    ("zh", "工作时间为周一至周五上午九点到下午六点。"),
    ("zh", "退货政策：商品签收后七天内可以无理由退货。"),
    # -- Japanese: names ----------------------------------------------------------------------
    ("ja", "お客様の[[name:山田太郎]]さんの注文を処理してください。"),
    ("ja", "[[name:佐藤花子]]様からの問い合わせです。丁寧に対応してください。"),
    ("ja", "担当者は[[name:鈴木一郎]]です。"),
    ("ja", "[[name:田中]]様、いつもご利用ありがとうございます。"),
    # -- Japanese: ids ------------------------------------------------------------------------
    ("ja", "会員番号は[[record_id:12345678]]です。"),
    ("ja", "ご注文番号[[record_id:ORD-2024-88812]]の配送状況を確認してください。"),
    # -- Japanese: look-alikes ----------------------------------------------------------------
    ("ja", "トヨタ自動車のサポート窓口です。"),
    ("ja", "あなたはソニーのアシスタントです。敬語で回答してください。"),
    ("ja", "営業時間は平日の九時から十八時までです。"),
    ("ja", "東京駅から新大阪駅までの新幹線について案内してください。"),
    ("ja", "お客様には丁寧な言葉遣いで対応してください。"),
    ("ja", "営業時間：月曜日〜金曜日 10時〜19時。"),  # no kana: jieba tags 金曜日 a name
]]
